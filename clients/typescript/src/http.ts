// The HTTP transport: `fetch` to the gateway, one route per operation (contracts/openapi.json).

import { OPERATIONS, type SessionAccepted, type SessionEnded } from "./generated/operations.js";
import { InvalidRequestError, UnavailableError } from "./generated/errors.js";
import { errorFromEnvelope, foreignHttpError, isEnvelope, parseReply } from "./reply.js";
import type { OperationSpec, StreamSpec } from "./spec.js";
import type { Fields, Transport } from "./transport.js";

/** `{kind, id}` -> `end_user:alice` (`none` has no id), as the gateway reads a query principal. */
function principalRef(value: unknown): string {
  const { kind, id } = value as { kind: string; id?: string | null };
  return id ? `${kind}:${id}` : kind;
}

function queryString(op: OperationSpec, fields: Fields): string {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(fields)) {
    if (value === undefined || value === null) continue;
    const encoding = op.query[name];
    if (encoding === "repeat") for (const item of value as unknown[]) params.append(name, String(item));
    else if (encoding === "principal") params.append(name, principalRef(value));
    else if (encoding === "json") params.append(name, JSON.stringify(value));
    else params.append(name, String(value));
  }
  const text = params.toString();
  return text ? `?${text}` : "";
}

/** Where and how a request travels: path fields in the path, the rest in the query (GET,
 * DELETE) or the JSON body — exactly as the gateway takes them apart (services/gateway/payloads.py). */
export function httpRequestOf(op: OperationSpec, fields: Fields): { path: string; body?: string } {
  const rest = { ...fields };
  let path = op.path;
  for (const name of op.pathParams) {
    const value = rest[name];
    if (value === undefined || value === null || value === "") {
      throw new InvalidRequestError(`${name} is required: it is part of the path ${op.path}`);
    }
    path = path.replace(`{${name}}`, encodeURIComponent(String(value)));
    delete rest[name];
  }
  if (op.method === "GET" || op.method === "DELETE") return { path: path + queryString(op, rest) };
  return { path, body: JSON.stringify(rest) };
}

/** A JSON Lines body's values, each checked for the error envelope that ends a failed stream. */
async function* jsonLines(body: ReadableStream<Uint8Array>): AsyncGenerator<unknown> {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const chunk of body) {
    buffer += decoder.decode(chunk, { stream: true });
    let end: number;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
      if (line.trim()) yield parseReply(line);
    }
  }
  buffer += decoder.decode();
  if (buffer.trim()) yield parseReply(buffer);
}

/** An error response as its typed error (the envelope's status is the HTTP status). */
async function errorOf(response: Response): Promise<Error> {
  const text = await response.text();
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch {
    return foreignHttpError(response.status, text);
  }
  return isEnvelope(data) ? errorFromEnvelope(data) : foreignHttpError(response.status, text);
}

export class HttpTransport implements Transport {
  readonly kind = "http";
  readonly #base: string;
  readonly #authorization: string;

  constructor(url: string, token: string) {
    this.#base = url.replace(/\/+$/, "");
    this.#authorization = `Bearer ${token}`;
  }

  async request(op: OperationSpec, fields: Fields, timeoutMs: number): Promise<unknown> {
    const { path, body } = httpRequestOf(op, fields);
    const response = await this.#send(op.name, op.method, path, body, timeoutMs);
    if (!response.ok) throw await errorOf(response);
    return parseReply(await response.text());
  }

  async *items(op: OperationSpec, fields: Fields, timeoutMs: number): AsyncGenerator<unknown> {
    const { path, body } = httpRequestOf(op, fields);
    const response = await this.#send(op.name, op.method, path, body, timeoutMs);
    if (!response.ok) throw await errorOf(response);
    if (response.body) yield* jsonLines(response.body);
  }

  async publish(_stream: StreamSpec, session: SessionEnded, timeoutMs: number): Promise<SessionAccepted> {
    // POST /v1/sessions is `engram.session.submit`: checked, then stored.
    return (await this.request(OPERATIONS.submitSession, session as unknown as Fields, timeoutMs)) as SessionAccepted;
  }

  async close(): Promise<void> {}

  /** The response once its headers arrived within `timeoutMs` (a JSON Lines body may take longer:
   * the gateway bounds each page); a refused connection or the deadline is UNAVAILABLE. */
  async #send(what: string, method: string, path: string, body: string | undefined, timeoutMs: number): Promise<Response> {
    const headers: Record<string, string> = { Authorization: this.#authorization };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(), timeoutMs);
    try {
      return await fetch(this.#base + path, { method, headers, body, signal: deadline.signal });
    } catch (cause) {
      if (deadline.signal.aborted) {
        throw new UnavailableError(`${what} did not answer within ${timeoutMs} ms; retry`, { cause });
      }
      throw new UnavailableError(`cannot reach ${this.#base}: ${(cause as Error).message}; retry`, { cause });
    } finally {
      clearTimeout(timer);
    }
  }
}

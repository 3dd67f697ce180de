import { loadConnectionInfo, parseConnectionInfo, type ConnectionInfo } from "./connection.js";
import {
  OPERATIONS,
  SESSION_ENDED,
  type OperationMethods,
  type SessionAccepted,
  type SessionEnded,
} from "./generated/operations.js";
import { HttpTransport } from "./http.js";
import { NatsTransport } from "./nats.js";
import type { CallOptions, OperationSpec } from "./spec.js";
import type { Fields, Transport } from "./transport.js";

/** How long a request waits for its reply unless the operation (e.g. purge: 60 s) or the call
 * says otherwise. */
export const DEFAULT_TIMEOUT_MS = 10_000;

export type TransportKind = "nats" | "http";

export interface ConnectOptions {
  /** Default: NATS when the connection info has a `nats_url`, else HTTP. */
  transport?: TransportKind;
  timeoutMs?: number;
  /** The NATS connection's name, as servers list it. */
  name?: string;
}

/**
 * Engram's operations over one transport: one method per operation of the table
 * (`OperationMethods`, generated), plus `publishSession`. Every method takes the operation's
 * request model and answers its reply model, or throws a typed EngramError.
 */
export class EngramClient {
  readonly #transport: Transport;
  readonly #timeoutMs: number;

  constructor(transport: Transport, options: { timeoutMs?: number } = {}) {
    this.#transport = transport;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  }

  /** Which transport this client speaks. */
  get transport(): TransportKind {
    return this.#transport.kind;
  }

  /** Publish `engram.session.ended` (NATS: into JetStream, answered once stored and checked after;
   * HTTP: POST /v1/sessions, i.e. `submitSession`, checked first). Engram takes each event_id of an
   * organization once; `submitSession` says `duplicate: true` for a repeat. */
  publishSession(session: SessionEnded, options?: CallOptions): Promise<SessionAccepted> {
    return this.#transport.publish(SESSION_ENDED, session, options?.timeoutMs ?? this.#timeoutMs);
  }

  async close(): Promise<void> {
    await this.#transport.close();
  }

  #timeout(op: OperationSpec, options?: CallOptions): number {
    return options?.timeoutMs ?? op.timeoutMs ?? this.#timeoutMs;
  }

  // One method per operation, from the generated map: nothing here names an operation.
  static {
    for (const [method, op] of Object.entries(OPERATIONS) as [string, OperationSpec][]) {
      const call = op.jsonLines
        ? function (this: EngramClient, fields: Fields, options?: CallOptions) {
            return this.#transport.items(op, fields, this.#timeout(op, options));
          }
        : function (this: EngramClient, fields: Fields, options?: CallOptions) {
            return this.#transport.request(op, fields, this.#timeout(op, options));
          };
      Object.defineProperty(EngramClient.prototype, method, { value: call, writable: true, configurable: true });
    }
  }
}

// The generated signatures of the methods installed above.
export interface EngramClient extends OperationMethods {}

/**
 * A client from a connection file (`.engram/connection.json` by default, as `engram up` writes
 * it; `engram credentials mint` issues one per platform client) or its parsed content.
 */
export async function connect(
  source: string | ConnectionInfo = ".engram/connection.json",
  options: ConnectOptions = {},
): Promise<EngramClient> {
  const info = typeof source === "string" ? await loadConnectionInfo(source) : parseConnectionInfo(source);
  const kind = options.transport ?? (info.nats_url ? "nats" : "http");
  let transport: Transport;
  if (kind === "nats") {
    if (!info.nats_url) throw new TypeError("the connection info has no nats_url: set it, or use transport: \"http\"");
    transport = await NatsTransport.connect({ ...info, nats_url: info.nats_url }, options.name ?? "engram-client-ts");
  } else {
    if (!info.http_url) throw new TypeError("the connection info has no http_url: set it, or use transport: \"nats\"");
    transport = new HttpTransport(info.http_url, info.token);
  }
  return new EngramClient(transport, { timeoutMs: options.timeoutMs });
}

// A reply's bytes -> its data, or the typed error its SPEC 9 envelope names (both transports).

import { EngramError } from "./errors.js";
import { ERROR_CLASSES, InternalError, UnavailableError, type ErrorCode } from "./generated/errors.js";

interface Envelope {
  error: { code: string; status?: number; message?: string; details?: Record<string, unknown> };
}

export function isEnvelope(data: unknown): data is Envelope {
  const error = (data as { error?: unknown } | null)?.error;
  return typeof error === "object" && error !== null && typeof (error as { code?: unknown }).code === "string";
}

/** The typed error of a SPEC 9 envelope; an unknown code is INTERNAL (as the Python client). */
export function errorFromEnvelope(envelope: Envelope): EngramError {
  const { code, status, message, details } = envelope.error;
  const kind = Object.hasOwn(ERROR_CLASSES, code) ? ERROR_CLASSES[code as ErrorCode] : InternalError;
  return new kind(message ?? code, { status, details: details ?? {} });
}

/** A success reply's data; an error envelope is thrown as its typed error. */
export function parseReply(text: string): unknown {
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (cause) {
    throw new InternalError("the reply is not JSON", { details: { reply: text.slice(0, 200) }, cause });
  }
  if (isEnvelope(data)) throw errorFromEnvelope(data);
  return data;
}

/** An HTTP answer that is not Engram's (a proxy's 502 page): retryable when the server side
 * failed, else INTERNAL; the status and the start of the body go into the details. */
export function foreignHttpError(status: number, body: string): EngramError {
  const kind = status >= 500 ? UnavailableError : InternalError;
  return new kind(`HTTP ${status} without an Engram error envelope`, {
    status,
    details: { body: body.slice(0, 200) },
  });
}

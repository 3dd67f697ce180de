import type { SessionAccepted, SessionEnded } from "./generated/operations.js";
import type { OperationSpec, StreamSpec } from "./spec.js";

/** A request's fields as they travel (the operation's request model, as JSON). */
export type Fields = Record<string, unknown>;

/**
 * How a client reaches Engram: NATS (src/nats.ts) or the HTTP gateway (src/http.ts). Both move
 * the same JSON; tenancy, permissions and errors are the services' on either.
 */
export interface Transport {
  readonly kind: "nats" | "http";
  /** One request-reply: the reply's data, or its SPEC 9 error thrown as a typed EngramError. */
  request(op: OperationSpec, fields: Fields, timeoutMs: number): Promise<unknown>;
  /** Every item of every page of a paged operation (`export`), in order. */
  items(op: OperationSpec, fields: Fields, timeoutMs: number): AsyncIterable<unknown>;
  /** Publish an ended session (JetStream, deduplicated by its event_id). */
  publish(stream: StreamSpec, session: SessionEnded, timeoutMs: number): Promise<SessionAccepted>;
  close(): Promise<void>;
}

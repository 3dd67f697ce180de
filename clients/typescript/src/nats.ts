// The NATS transport: @nats-io/transport-node with the client's nkey identity and own inbox
// prefix; request-reply with the bearer token in a header; sessions into JetStream.

import { jetstream, type JetStreamClient } from "@nats-io/jetstream";
import {
  ClosedConnectionError,
  ConnectionError,
  DrainingConnectionError,
  headers,
  nkeyAuthenticator,
  NoRespondersError,
  RequestError,
  TimeoutError,
  type MsgHdrs,
  type NatsConnection,
} from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";

import type { ConnectionInfo } from "./connection.js";
import { UnavailableError } from "./generated/errors.js";
import type { SessionAccepted, SessionEnded } from "./generated/operations.js";
import { parseReply } from "./reply.js";
import type { OperationSpec, StreamSpec } from "./spec.js";
import type { Fields, Transport } from "./transport.js";

/** The nats.js error and every cause under it. */
function causes(error: unknown): unknown[] {
  const chain: unknown[] = [];
  for (let e = error; e instanceof Error && chain.length < 8; e = e.cause) chain.push(e);
  return chain;
}

/** What the gateway answers in the same case (services/gateway/bridge.py): no service
 * subscribed, no answer in time, or no connection — all UNAVAILABLE, all worth a retry. Anything
 * else (a bad subject, a permissions violation of this NATS identity) is thrown as it is. */
function unavailable(what: string, timeoutMs: number, error: unknown): unknown {
  const chain = causes(error);
  const is = (kind: new (...args: never[]) => Error) => chain.some((e) => e instanceof kind);
  const options = { cause: error };
  if (is(NoRespondersError) || (error instanceof RequestError && error.isNoResponders())) {
    return new UnavailableError(`no service answers ${what} right now; retry`, options);
  }
  if (is(TimeoutError)) return new UnavailableError(`${what} did not answer within ${timeoutMs} ms; retry`, options);
  if (is(ClosedConnectionError) || is(DrainingConnectionError) || is(ConnectionError)) {
    return new UnavailableError(`the NATS connection is closed; ${what} was not sent`, options);
  }
  return error;
}

export class NatsTransport implements Transport {
  readonly kind = "nats";
  readonly #nc: NatsConnection;
  readonly #js: JetStreamClient;
  readonly #authorization: string;

  private constructor(nc: NatsConnection, token: string) {
    this.#nc = nc;
    this.#js = jetstream(nc);
    this.#authorization = `Bearer ${token}`;
  }

  /** Connect as the client's NATS identity (its nkey), receiving replies under its own inbox
   * prefix — the only subjects that identity may subscribe to. */
  static async connect(info: ConnectionInfo & { nats_url: string }, name: string): Promise<NatsTransport> {
    const seed = info.nats_nkey_seed;
    let nc: NatsConnection;
    try {
      nc = await connect({
        servers: info.nats_url,
        name,
        inboxPrefix: info.nats_inbox_prefix ?? "_INBOX",
        authenticator: seed ? nkeyAuthenticator(new TextEncoder().encode(seed)) : undefined,
      });
    } catch (cause) {
      throw new UnavailableError(`cannot connect to NATS at ${info.nats_url}: ${(cause as Error).message}`, { cause });
    }
    return new NatsTransport(nc, info.token);
  }

  #headers(): MsgHdrs {
    const h = headers();
    h.set("Authorization", this.#authorization);
    return h;
  }

  async request(op: OperationSpec, fields: Fields, timeoutMs: number): Promise<unknown> {
    let reply;
    try {
      reply = await this.#nc.request(op.subject, JSON.stringify(fields), {
        timeout: timeoutMs,
        headers: this.#headers(),
      });
    } catch (error) {
      throw unavailable(op.name, timeoutMs, error);
    }
    return parseReply(reply.string());
  }

  /** Page after page (each re-authorized by Engram) until `next_page_token` is null. */
  async *items(op: OperationSpec, fields: Fields, timeoutMs: number): AsyncGenerator<unknown> {
    let pageToken = fields.page_token;
    do {
      const page = (await this.request(op, { ...fields, page_token: pageToken }, timeoutMs)) as {
        entries: unknown[];
        next_page_token: string | null;
      };
      yield* page.entries;
      pageToken = page.next_page_token;
    } while (pageToken);
  }

  /** JetStream publish, acknowledged once stored (checked by ingest after). No Nats-Msg-Id: Engram
   * takes each organization's event_id once after verifying the token, and JetStream would drop
   * this session if anyone had published that id first (docs/adr/0081-session-dedupe.md). */
  async publish(stream: StreamSpec, session: SessionEnded, timeoutMs: number): Promise<SessionAccepted> {
    try {
      const ack = await this.#js.publish(stream.subject, JSON.stringify(session), {
        headers: this.#headers(),
        timeout: timeoutMs,
      });
      return { status: 202, event_id: session.event_id, stream_seq: ack.seq, duplicate: ack.duplicate };
    } catch (error) {
      throw unavailable(stream.name, timeoutMs, error);
    }
  }

  async close(): Promise<void> {
    if (!this.#nc.isClosed()) await this.#nc.drain();
  }
}

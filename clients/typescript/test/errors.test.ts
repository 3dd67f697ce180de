// A typed error for each SPEC 9 code: every code decodes to its class, and each code a client can
// provoke is provoked over both transports against a live `engram up`.
//
// Not provoked here, because no client request can cause them on a healthy stack (the decoding
// test covers their classes): RATE_LIMITED (nothing in Engram limits request rates today),
// EMBEDDING_DIMENSION_MISMATCH (an embedding endpoint answering vectors of the wrong size: the
// deployment's model), VECTOR_UNAVAILABLE (the vector index failing), INTERNAL (a defect), and
// UNAVAILABLE from a service (one not answering). The client's own UNAVAILABLE — Engram cannot be
// reached — is provoked below.

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, before, describe, test } from "node:test";

import {
  connect,
  EngramError,
  ERROR_CLASSES,
  errorFromEnvelope,
  ForbiddenError,
  InternalError,
  InvalidRequestError,
  NotFoundError,
  PayloadTooLargeError,
  SemanticDisabledError,
  SessionRequiredError,
  UnauthenticatedError,
  UnavailableError,
  UserOverrideNotPermittedError,
  WritePolicyDeniedError,
  type EngramClient,
  type ErrorCode,
} from "../src/index.js";
import { connectionInfo, connectTo, freshScope, TRANSPORTS } from "./support.js";

describe("error envelopes", () => {
  test("every SPEC 9 code decodes to its own EngramError subclass with its status and details", () => {
    for (const [code, kind] of Object.entries(ERROR_CLASSES) as [ErrorCode, typeof EngramError][]) {
      const error = errorFromEnvelope({ error: { code, status: kind.status, message: "m", details: { k: 1 } } });
      assert.ok(error instanceof kind && error instanceof EngramError && error instanceof Error, code);
      assert.deepEqual([error.code, error.status, error.message, error.details], [code, kind.status, "m", { k: 1 }]);
      assert.equal(error.name, kind.name);
    }
  });

  test("exactly UNAVAILABLE, VECTOR_UNAVAILABLE and RATE_LIMITED are retryable", () => {
    const retryable = Object.entries(ERROR_CLASSES)
      .filter(([code, kind]) => errorFromEnvelope({ error: { code, status: kind.status } }).retryable)
      .map(([code]) => code);
    assert.deepEqual(retryable.sort(), ["RATE_LIMITED", "UNAVAILABLE", "VECTOR_UNAVAILABLE"]);
  });

  test("an unknown code is INTERNAL, keeping the status the wire gave", () => {
    const error = errorFromEnvelope({ error: { code: "NEW_CODE", status: 418, message: "m" } });
    assert.ok(error instanceof InternalError);
    assert.equal(error.status, 418);
  });
});

/** The error `call` throws, checked to be `kind` (a typed failure message says what came instead). */
async function failure<T extends EngramError>(kind: abstract new (...args: never[]) => T, call: () => Promise<unknown>): Promise<T> {
  try {
    const reply = await call();
    assert.fail(`expected ${kind.name}, got the reply ${JSON.stringify(reply).slice(0, 300)}`);
  } catch (error) {
    if (!(error instanceof kind)) throw error;
    return error;
  }
}

for (const transport of TRANSPORTS) {
  describe(`typed errors over ${transport}`, () => {
    const { agent_config_id, principal } = freshScope(`errors-${transport}`);
    let engram: EngramClient;
    let entryId: string;

    before(async () => {
      engram = await connectTo(transport);
      const saved = await engram.save({ agent_config_id, principal, wait: true, entries: [{ text: "Alice likes tea." }] });
      assert.ok("ids" in saved, JSON.stringify(saved));
      entryId = saved.ids[0]!;
    });
    after(async () => {
      await engram?.close();
    });

    test("INVALID_REQUEST: a field out of bounds, with the validation details", async () => {
      const error = await failure(InvalidRequestError, () => engram.recall({ agent_config_id, principal, top_k: 0 }));
      assert.equal(error.status, 400);
      assert.match(JSON.stringify(error.details), /top_k/);
      assert.equal(error.retryable, false);
    });

    test("UNAUTHENTICATED: a forged token", async () => {
      const forged = await connect({ ...connectionInfo(), token: "forged" }, { transport });
      try {
        const error = await failure(UnauthenticatedError, () => forged.getConfig({ agent_config_id }));
        assert.equal(error.status, 401);
      } finally {
        await forged.close();
      }
    });

    test("FORBIDDEN: reading another owner's memory without memory.admin", async () => {
      const error = await failure(ForbiddenError, () =>
        engram.listEntries({ agent_config_id, principal, actor_ref: "end_user:bob" }),
      );
      assert.equal(error.status, 403);
    });

    test("NOT_FOUND: an entry that does not exist", async () => {
      const missing = "00000000-0000-4000-8000-000000000000";
      const error = await failure(NotFoundError, () => engram.getEntry({ agent_config_id, principal, entry_id: missing }));
      assert.equal(error.status, 404);
    });

    test("SESSION_REQUIRED and SEMANTIC_DISABLED: a session-scoped config without semantic recall", async () => {
      const scoped = freshScope(`session-scoped-${transport}`);
      const config = { scope: "session" as const, semantic_recall: { enabled: false } };
      await engram.putConfig({ agent_config_id: scoped.agent_config_id, config });
      const asked = { agent_config_id: scoped.agent_config_id, principal: scoped.principal };
      await failure(SessionRequiredError, () => engram.recall(asked));
      const error = await failure(SemanticDisabledError, () =>
        engram.recall({ ...asked, session_id: "s-1", strategy: "semantic", cue: "tea" }),
      );
      assert.equal(error.status, 400);
    });

    test("USER_OVERRIDE_NOT_PERMITTED: a policy override of an axis that is not relaxable", async () => {
      const error = await failure(UserOverrideNotPermittedError, () =>
        engram.recall({ agent_config_id, principal, policy_override: { scope: "org" } }),
      );
      assert.deepEqual([error.status, error.details.keys], [403, ["scope"]]);
    });

    test("WRITE_POLICY_DENIED: an edit bringing PII into a config that blocks it", async () => {
      await engram.putConfig({ agent_config_id, config: { pii_handling: "block" } });
      const error = await failure(WritePolicyDeniedError, () =>
        engram.manage({ agent_config_id, principal, entry_id: entryId, op: "edit", text: "Mail alice@example.com." }),
      );
      assert.deepEqual([error.status, error.details.reason], [422, "pii:EMAIL"]);
    });

    test("PAYLOAD_TOO_LARGE: a request over 256 KiB", async () => {
      const error = await failure(PayloadTooLargeError, () =>
        engram.recall({ agent_config_id, principal, cue: "x".repeat(300_000) }),
      );
      assert.deepEqual([error.status, error.details.limit], [413, 262_144]);
    });

    test("UNAVAILABLE (retryable) when Engram cannot be reached", async () => {
      const unreachable = await unreachableClient(transport);
      const error = await failure(UnavailableError, () => unreachable.getConfig({ agent_config_id }));
      assert.equal(error.retryable, true);
    });
  });
}

/** NATS: a client whose connection is closed; HTTP: a gateway URL nothing listens on. */
async function unreachableClient(transport: "nats" | "http"): Promise<EngramClient> {
  if (transport === "nats") {
    const closed = await connectTo("nats");
    await closed.close();
    return closed;
  }
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return connect({ ...connectionInfo(), http_url: `http://127.0.0.1:${port}` }, { transport: "http" });
}

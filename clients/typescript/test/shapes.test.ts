// What needs no server: the connection file is checked when read, and a GET/DELETE request is
// spread over path and query exactly as the gateway takes it apart (services/gateway/payloads.py).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { httpRequestOf } from "../src/http.js";
import { connect, InvalidRequestError, OPERATIONS, parseConnectionInfo } from "../src/index.js";

describe("connection info", () => {
  test("a file without a token or without any URL fails when read, saying what to set", () => {
    assert.throws(() => parseConnectionInfo({ nats_url: "nats://x" }, "c.json"), /c.json has no token: set "token"/);
    assert.throws(() => parseConnectionInfo({ token: "t" }, "c.json"), /neither nats_url nor http_url/);
    assert.throws(() => parseConnectionInfo({ token: "t", http_url: 8080 }, "c.json"), /"http_url" must be a string/);
    assert.throws(() => parseConnectionInfo([], "c.json"), /must be a JSON object/);
  });

  test("fields beyond the client's (database_url) are ignored", () => {
    const info = parseConnectionInfo({ token: "t", http_url: "http://h", database_url: "postgresql://" });
    assert.deepEqual(info, { token: "t", http_url: "http://h" });
  });

  test("asking for a transport the file has no URL for fails at connect, naming the field", async () => {
    await assert.rejects(connect({ token: "t", http_url: "http://h" }, { transport: "nats" }), /no nats_url/);
    await assert.rejects(connect({ token: "t", nats_url: "nats://h" }, { transport: "http" }), /no http_url/);
  });
});

describe("HTTP request shape", () => {
  test("path fields go into the path (escaped), lists repeat, principals are refs, objects are JSON", () => {
    const { path, body } = httpRequestOf(OPERATIONS.listEntries, {
      agent_config_id: "a",
      principal: { kind: "end_user", id: "alice" },
      lifecycle: ["active", "stale"],
      metadata: { order: "A-1042" },
      page_token: null,
      min_importance: 0.5,
    });
    assert.equal(body, undefined);
    const query = new URL(path, "http://h").searchParams;
    assert.deepEqual(query.getAll("lifecycle"), ["active", "stale"]);
    assert.equal(query.get("principal"), "end_user:alice");
    assert.deepEqual(JSON.parse(query.get("metadata")!), { order: "A-1042" });
    assert.equal(query.get("min_importance"), "0.5");
    assert.equal(query.has("page_token"), false);

    const get = httpRequestOf(OPERATIONS.getEntry, { agent_config_id: "a", entry_id: "x/y", principal: { kind: "none" } });
    assert.equal(get.path, "/v1/memories/x%2Fy?agent_config_id=a&principal=none");
  });

  test("a body carries every field but the path's", () => {
    const { path, body } = httpRequestOf(OPERATIONS.manage, { agent_config_id: "a", entry_id: "e", op: "pin" });
    assert.equal(path, "/v1/memories/e");
    assert.deepEqual(JSON.parse(body!), { agent_config_id: "a", op: "pin" });
  });

  test("a missing path field is INVALID_REQUEST before anything is sent", () => {
    assert.throws(() => httpRequestOf(OPERATIONS.delete, { agent_config_id: "a" }), InvalidRequestError);
  });
});

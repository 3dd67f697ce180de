// A real OpenID provider (oidc-provider) for Engram's OIDC tests (tests/support/oidc.py starts it).
//
//   node provider.mjs CONFIG.json
//
// CONFIG: {"port": 0, "keys": {"keys": [private JWKs, each with kid and alg]},
//          "clients": [{"client_id", "client_secret", "org_id", "principal_kind"?, "alg"}]}
// Each client gets JWT access tokens (client-credentials grant with a resource indicator: the
// resource is the audience) signed with its `alg`, carrying `org_id` (and `principal_kind`) and
// the granted `scope`. Prints {"issuer": ...} on one line once listening.
//
// Test-only controls (loopback; what a real IdP's operator would do):
//   POST /_test/keys  {"keys": [...]}   rotate: serve a new key set (a new provider instance on the
//                                      same issuer and clients), tokens from then on signed with it
//   POST /_test/down  {"down": bool}    discovery and the key set answer 503 while down
//   GET  /_test/fetches                 how many times the key set was fetched
import { readFileSync } from 'node:fs';
import http from 'node:http';

import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const SCOPES = ['memory.read', 'memory.write', 'memory.admin', 'memory.purge', 'deployment.operator'];

let issuer;
let current;
let down = false;
let fetches = 0;

function build(keys) {
  const byId = new Map(config.clients.map((c) => [c.client_id, c]));
  const provider = new Provider(issuer, {
    clients: config.clients.map((c) => ({
      client_id: c.client_id,
      client_secret: c.client_secret,
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
    })),
    jwks: keys,
    scopes: SCOPES,
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => undefined,
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, resource, client) => ({
          scope: SCOPES.join(' '),
          audience: resource,
          accessTokenTTL: 600,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: byId.get(client.clientId).alg } },
        }),
      },
    },
    extraTokenClaims: (ctx, token) => {
      const client = byId.get(token.clientId);
      const claims = { org_id: client.org_id };
      if (client.principal_kind) claims.principal_kind = client.principal_kind;
      return claims;
    },
  });
  provider.proxy = false;
  return provider.callback();
}

function body(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve(JSON.parse(Buffer.concat(chunks).toString() || '{}')));
    req.on('error', reject);
  });
}

function reply(res, status, value) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(value));
}

const server = http.createServer(async (req, res) => {
  try {
    if (req.url === '/_test/keys' && req.method === 'POST') {
      current = build(await body(req));
      reply(res, 200, { ok: true });
    } else if (req.url === '/_test/down' && req.method === 'POST') {
      ({ down } = await body(req));
      reply(res, 200, { ok: true });
    } else if (req.url === '/_test/fetches') {
      reply(res, 200, { fetches });
    } else if (down && (req.url.startsWith('/jwks') || req.url.startsWith('/.well-known/'))) {
      reply(res, 503, { error: 'down' });
    } else {
      if (req.url.startsWith('/jwks')) fetches += 1;
      current(req, res);
    }
  } catch (err) {
    reply(res, 500, { error: String(err) });
  }
});

server.listen(config.port || 0, '127.0.0.1', () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  current = build(config.keys);
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});

process.on('SIGTERM', () => server.close(() => process.exit(0)));

// The stock npm `nacos` SDK (nacos-naming, the v1 HTTP Open API) against a Shoal node that needs
// a login: `node nacos_auth.js <host:port> <service> [<username> <password>]`. It sends the
// username and password on every call (docs/protocol.md §5.6). Registers one instance and reads
// the service back; prints one JSON line: {registered, hosts} or {registered: false, status, error}.
// Every call is bounded, so a refusal is an answer and never a hang.
"use strict";

const { NacosNamingClient } = require("nacos");

const [addr, service, username, password] = process.argv.slice(2);
const STEP_TIMEOUT_MS = 20000;
const statuses = [];
const logger = {
  info() {}, debug() {}, error() {},
  warn(err) { if (err && err.status) statuses.push(err.status); },
};

function bounded(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not finish in ${STEP_TIMEOUT_MS} ms`)), STEP_TIMEOUT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function main() {
  const client = new NacosNamingClient({ serverList: addr, namespace: "public", logger, username, password });
  await bounded(client.ready(), "ready");
  try {
    await bounded(client.registerInstance(service, { ip: "10.7.5.1", port: 8080 }), "register");
  } catch (err) {
    return { registered: false, status: statuses[statuses.length - 1] || 0, error: String(err.message || err) };
  }
  const hosts = await bounded(client.getAllInstances(service, "DEFAULT_GROUP", "", false), "query");
  await bounded(client.deregisterInstance(service, { ip: "10.7.5.1", port: 8080 }), "deregister");
  return { registered: true, hosts: hosts.map((h) => `${h.ip}:${h.port}`).sort() };
}

main().then(
  (out) => { console.log(JSON.stringify(out)); process.exit(0); },
  (err) => { console.log(JSON.stringify({ registered: false, status: 0, error: String(err && err.stack || err) })); process.exit(1); },
);

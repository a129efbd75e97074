// Shoal console: one vanilla module, no build step, no third-party code.
// Pages (hash routes): #/login, #/services, #/service, #/cluster.
// The token is kept as the Nacos console keeps it: localStorage "token" holds the login answer
// (JSON with accessToken), and every request carries accessToken as a query parameter.

const main = document.getElementById("main");
const flashBox = document.getElementById("flash");
let serverState = null;

// --- small DOM helper: text is always set as text, never parsed as HTML ---------------------
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function flash(text, isError = false) {
  flashBox.replaceChildren(h("div", { class: isError ? "msg error" : "msg" }, text));
}

// --- token and requests ------------------------------------------------------------------------
function token() {
  try { return JSON.parse(localStorage.getItem("token") || "{}").accessToken || ""; } catch { return ""; }
}

class ApiError extends Error {
  constructor(status, text) { super(text || `HTTP ${status}`); this.status = status; }
}

async function api(method, path, params = {}) {
  const query = new URLSearchParams();
  const t = token();
  if (t) query.set("accessToken", t);
  const body = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null) continue;
    (method === "GET" ? query : body).set(k, String(v));
  }
  const init = { method, headers: {} };
  if (method !== "GET") {
    init.body = body.toString();
    init.headers["Content-Type"] = "application/x-www-form-urlencoded";
  }
  const res = await fetch(`${path}?${query}`, init);
  const text = await res.text();
  if (res.status === 403 && authOn()) {
    localStorage.removeItem("token");
    location.hash = "#/login";
    throw new ApiError(403, "please log in");
  }
  if (!res.ok) {
    let message = text;
    try { const j = JSON.parse(text); message = j.data || j.message || text; } catch { /* plain text */ }
    throw new ApiError(res.status, message);
  }
  try { return JSON.parse(text); } catch { return text; }
}

function authOn() { return serverState && serverState.auth_enabled === "true"; }

function route() {
  const [path, qs] = location.hash.replace(/^#/, "").split("?");
  return { path: path || "/services", q: new URLSearchParams(qs || "") };
}

function go(path, q) { location.hash = `#${path}?${new URLSearchParams(q)}`; }

// --- login -----------------------------------------------------------------------------------------
function loginPage() {
  const user = h("input", { id: "login-username", autocomplete: "username", required: true });
  const pass = h("input", { id: "login-password", type: "password", autocomplete: "current-password", required: true });
  const form = h("form", { class: "card login", id: "login-form" },
    h("h1", {}, "Log in to Shoal"),
    h("label", { for: "login-username" }, "Username"), user,
    h("label", { for: "login-password" }, "Password"), pass,
    h("button", { class: "primary", id: "login-submit", type: "submit" }, "Log in"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const answer = await api("POST", "/nacos/v1/auth/login", { username: user.value, password: pass.value });
      localStorage.setItem("token", JSON.stringify(answer));
      flashBox.replaceChildren();
      location.hash = "#/services";
    } catch (e) {
      flash(`Login failed: ${e.message}`, true);
    }
  });
  main.replaceChildren(form);
  user.focus();
}

// --- namespaces ----------------------------------------------------------------------------------
async function namespaces() {
  // The namespace API when the node has one; else every namespace that has services.
  try {
    const r = await api("GET", "/nacos/v1/console/namespaces");
    const list = Array.isArray(r) ? r : r.data;
    if (Array.isArray(list) && list.length) {
      return list.map((n) => ({ id: n.namespace || "public", name: n.namespaceShowName || n.namespace || "public" }));
    }
  } catch { /* not offered by this node */ }
  const r = await api("GET", "/nacos/v1/ns/service/names", {});
  const ids = new Set(["public", ...Object.keys(r["META-INF/services"] || {})]);
  return [...ids].sort().map((id) => ({ id, name: id }));
}

// --- services ------------------------------------------------------------------------------------
async function servicesPage(q) {
  const ns = q.get("ns") || "public";
  const name = q.get("name") || "";
  const group = q.get("group") || "";
  const page = Math.max(parseInt(q.get("page") || "1", 10) || 1, 1);
  const size = parseInt(q.get("size") || "20", 10) || 20;
  const unhealthy = q.get("unhealthy") === "1";
  const state = { ns, name, group, page: 1, size, unhealthy: unhealthy ? "1" : "0" };

  const nsSelect = h("select", { id: "namespace", onchange: () => go("/services", { ...state, ns: nsSelect.value }) });
  const nameIn = h("input", { id: "search-name", placeholder: "service name", value: name });
  const groupIn = h("input", { id: "search-group", placeholder: "group", value: group });
  const unhealthyBox = h("input", { id: "unhealthy-only", type: "checkbox", checked: unhealthy });
  const search = () => go("/services", { ...state, name: nameIn.value.trim(), group: groupIn.value.trim(),
    unhealthy: unhealthyBox.checked ? "1" : "0" });
  unhealthyBox.addEventListener("change", search);
  const form = h("form", { class: "toolbar", onsubmit: (e) => { e.preventDefault(); search(); } },
    h("label", {}, "Namespace ", nsSelect), nameIn, groupIn,
    h("button", { class: "primary", type: "submit", id: "search" }, "Search"),
    h("label", {}, unhealthyBox, " only services with unhealthy or disabled instances"));
  const body = h("tbody");
  const table = h("table", { id: "services" },
    h("thead", {}, h("tr", {},
      h("th", {}, "Service"), h("th", {}, "Group"), h("th", { class: "num" }, "Clusters"),
      h("th", { class: "num" }, "Instances"), h("th", { class: "num" }, "Healthy"),
      h("th", { class: "num" }, "Subscribers"), h("th", {}, ""))), body);
  const pager = h("div", { class: "pager" });
  main.replaceChildren(h("h1", {}, "Services"), form, table, pager);

  namespaces().then((list) => {
    if (!list.some((n) => n.id === ns)) list.push({ id: ns, name: ns });
    nsSelect.replaceChildren(...list.map((n) => h("option", { value: n.id, selected: n.id === ns }, n.name)));
  }).catch((e) => flash(`Namespaces: ${e.message}`, true));

  const r = await api("GET", "/nacos/v1/ns/catalog/services", {
    namespaceId: ns, serviceNameParam: name, groupNameParam: group, pageNo: page, pageSize: size,
    unhealthyOnly: unhealthy,
  });
  body.replaceChildren(...r.serviceList.map((s) => {
    const link = `#/service?${new URLSearchParams({ ns, group: s.groupName, name: s.name })}`;
    const bad = s.healthyInstanceCount < s.ipCount;
    return h("tr", { dataset: { service: `${s.groupName}@@${s.name}` } },
      h("td", {}, h("a", { href: link }, s.name)), h("td", {}, s.groupName),
      h("td", { class: "num" }, s.clusterCount), h("td", { class: "num" }, s.ipCount),
      h("td", { class: bad ? "num bad" : "num" }, s.healthyInstanceCount),
      h("td", { class: "num" }, s.subscriberCount ?? ""),
      h("td", {}, h("a", { href: link }, "Details")));
  }));
  if (!r.serviceList.length) body.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No services.")));
  const pages = Math.max(Math.ceil(r.count / size), 1);
  const sizeSel = h("select", { id: "page-size", onchange: () => go("/services", { ...state, size: sizeSel.value }) },
    ...[10, 20, 50, 100].map((n) => h("option", { value: n, selected: n === size }, `${n} / page`)));
  pager.replaceChildren(
    h("button", { id: "prev", disabled: page <= 1, onclick: () => go("/services", { ...state, page: page - 1 }) }, "‹ Prev"),
    h("span", { id: "page-info" }, `Page ${page} of ${pages} · ${r.count} services`),
    h("button", { id: "next", disabled: page >= pages, onclick: () => go("/services", { ...state, page: page + 1 }) }, "Next ›"),
    sizeSel);
}

// --- one service -----------------------------------------------------------------------------------
function metaText(md) { return Object.entries(md || {}).map(([k, v]) => `${k}=${v}`).join("\n"); }

function parseMeta(text) {
  const out = {};
  for (const line of text.split(/\n/)) {
    const t = line.trim();
    if (!t) continue;
    const i = t.indexOf("=");
    if (i <= 0) throw new Error(`metadata line "${t}" is not key=value`);
    out[t.slice(0, i).trim()] = t.slice(i + 1).trim();
  }
  return out;
}

async function servicePage(q) {
  const ns = q.get("ns") || "public";
  const group = q.get("group") || "DEFAULT_GROUP";
  const name = q.get("name") || "";
  const key = { namespaceId: ns, groupName: group, serviceName: name };
  const [detail, inst, subs, pubs] = await Promise.all([
    api("GET", "/nacos/v1/ns/catalog/service", key),
    api("GET", "/nacos/v1/ns/catalog/instances", { ...key, pageNo: 1, pageSize: 1000 }),
    api("GET", "/nacos/v1/ns/service/subscribers", { ...key, pageNo: 1, pageSize: 1000 }),
    api("GET", "/nacos/v2/ns/client/service/publisher/list", key).catch(() => ({ data: [] })),
  ]);
  // Which node holds the client that publishes each instance ("" = the node serving this page).
  const owners = new Map((pubs.data || []).map((p) => [`${p.ip}:${p.port}:${p.clusterName}`, p.owner || "this node"]));
  const reload = () => servicePage(q).catch((e) => flash(e.message, true));

  // service metadata and protect threshold
  const threshold = h("input", { id: "protect-threshold", type: "number", step: "0.01", min: "0", max: "1",
    value: detail.service.protectThreshold });
  const svcMeta = h("textarea", { id: "service-metadata", rows: 3, cols: 40 }, metaText(detail.service.metadata));
  const saveService = h("button", { id: "save-service", onclick: async () => {
    try {
      await api("PUT", "/nacos/v1/ns/service", { ...key, protectThreshold: threshold.value,
        metadata: JSON.stringify(parseMeta(svcMeta.value)) });
      flash("Service saved.");
      reload();
    } catch (e) { flash(`Saving the service failed: ${e.message}`, true); }
  } }, "Save service");
  const card = h("div", { class: "card" }, h("div", { class: "grid" },
    h("span", { class: "muted" }, "Namespace"), h("span", {}, ns),
    h("span", { class: "muted" }, "Group"), h("span", {}, group),
    h("span", { class: "muted" }, "Ephemeral"), h("span", {}, String(detail.service.ephemeral)),
    h("span", { class: "muted" }, "Protect threshold"), threshold,
    h("span", { class: "muted" }, "Metadata (key=value lines)"), svcMeta,
    h("span", {}), h("span", {}, saveService)));

  // instances by cluster
  const byCluster = new Map();
  for (const c of detail.clusters) byCluster.set(c.name, []);
  for (const i of inst.list) {
    if (!byCluster.has(i.clusterName)) byCluster.set(i.clusterName, []);
    byCluster.get(i.clusterName).push(i);
  }
  const sections = [];
  for (const [cluster, list] of byCluster) {
    const rows = list.map((i) => instanceRow(key, i, reload, owners.get(`${i.ip}:${i.port}:${i.clusterName}`) || ""));
    sections.push(h("h2", {}, `Cluster ${cluster} · ${list.length} instances`),
      h("table", { class: "instances", dataset: { cluster } },
        h("thead", {}, h("tr", {}, h("th", {}, "IP"), h("th", { class: "num" }, "Port"), h("th", {}, "Weight"),
          h("th", {}, "Healthy"), h("th", {}, "Enabled"), h("th", {}, "Ephemeral"), h("th", {}, "Owner node"),
          h("th", {}, "Metadata"), h("th", {}, ""))),
        h("tbody", {}, rows)));
  }
  if (inst.count > inst.list.length) sections.push(h("p", { class: "muted" }, `Showing ${inst.list.length} of ${inst.count} instances.`));

  const subRows = subs.subscribers.map((s) => h("tr", {},
    h("td", {}, s.addrStr), h("td", {}, s.app), h("td", {}, s.agent), h("td", {}, s.cluster || "(all)")));
  if (!subRows.length) subRows.push(h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No subscribers on this node.")));

  main.replaceChildren(
    h("h1", {}, h("a", { href: `#/services?${new URLSearchParams({ ns })}` }, "Services"), ` / ${group} / ${name}`),
    card, ...sections,
    h("h2", {}, `Subscribers · ${subs.count}`),
    h("table", { id: "subscribers" }, h("thead", {}, h("tr", {}, h("th", {}, "Address"), h("th", {}, "App"),
      h("th", {}, "Agent"), h("th", {}, "Clusters"))), h("tbody", {}, subRows)));
}

function instanceRow(key, i, reload, owner) {
  const target = { ...key, ip: i.ip, port: i.port, clusterName: i.clusterName, ephemeral: i.ephemeral };
  const act = async (what, params) => {
    try {
      await api("PATCH", "/nacos/v1/ns/instance", { ...target, ...params });
      flash(`${i.ip}:${i.port}: ${what}.`);
      reload();
    } catch (e) { flash(`${i.ip}:${i.port}: ${e.message}`, true); }
  };
  const weight = h("input", { class: "weight-input", type: "number", step: "0.1", min: "0", max: "10000", value: i.weight });
  const md = h("textarea", { class: "metadata-input", rows: 2, cols: 28 }, metaText(i.metadata));
  return h("tr", { class: i.enabled ? "" : "off", dataset: { instance: `${i.ip}:${i.port}` } },
    h("td", {}, i.ip), h("td", { class: "num" }, i.port),
    h("td", {}, weight, " ", h("button", { class: "save-weight", onclick: () => act(`weight ${weight.value}`, { weight: weight.value }) }, "Save")),
    h("td", { class: i.healthy ? "good" : "bad" }, i.healthy ? "healthy" : "unhealthy"),
    h("td", {}, i.enabled ? "enabled " : "disabled ",
      h("button", { class: "toggle-enabled", onclick: () => act(i.enabled ? "disabled" : "enabled", { enabled: !i.enabled }) },
        i.enabled ? "Disable" : "Enable")),
    h("td", {}, String(i.ephemeral)),
    h("td", { class: "owner" }, owner),
    h("td", {}, md, " ", h("button", { class: "save-metadata", onclick: () => {
      let parsed;
      try { parsed = parseMeta(md.value); } catch (e) { flash(e.message, true); return; }
      act("metadata saved", { metadata: JSON.stringify(parsed) });
    } }, "Save")),
    h("td", {}, h("button", { class: "danger remove", onclick: async () => {
      if (!confirm(`Remove ${i.ip}:${i.port}? An SDK that is still connected registers it again.`)) return;
      try {
        await api("DELETE", "/nacos/v1/ns/instance", target);
        flash(`${i.ip}:${i.port}: removed.`);
        reload();
      } catch (e) { flash(`${i.ip}:${i.port}: ${e.message}`, true); }
    } }, "Remove")));
}

// --- cluster ---------------------------------------------------------------------------------------
async function clusterPage() {
  const nodes = await api("GET", "/nacos/v1/core/cluster/nodes", {});
  const members = nodes.data || [];
  const extraKeys = [...new Set(members.flatMap((m) => Object.keys(m.extendInfo || {})))].sort();
  const rows = members.map((m) => h("tr", { dataset: { member: m.address } },
    h("td", {}, m.address),
    h("td", { class: m.state === "UP" ? "good" : "bad" }, m.state),
    h("td", { class: "num" }, m.failAccessCnt ?? ""),
    ...extraKeys.map((k) => h("td", { class: "meta" }, fmt((m.extendInfo || {})[k])))));
  const pair = ([k, v]) => [h("span", { class: "muted" }, k), h("span", {}, fmt(v))];
  const up = members.filter((m) => m.state === "UP").length;
  main.replaceChildren(h("h1", {}, `Cluster · ${members.length} members · ${up} up`),
    h("table", { id: "members" }, h("thead", {}, h("tr", {}, h("th", {}, "Address"), h("th", {}, "State"),
      h("th", { class: "num" }, "Failed accesses"), ...extraKeys.map((k) => h("th", {}, k)))), h("tbody", {}, rows)),
    h("h2", {}, "This node: settings in effect, transport and kernels"),
    h("div", { class: "card grid", id: "node-state" }, Object.entries(serverState || {}).map(pair).flat()),
    h("h2", {}, "This node: registry and Distro figures"),
    h("div", { class: "card grid", id: "node-figures" }, h("span", { class: "muted" }, "loading…")));
  const figures = [];
  try {
    const m = await api("GET", "/nacos/v1/ns/operator/metrics", { onlyStatus: false });
    for (const [k, v] of Object.entries(m)) figures.push([k, v]);
  } catch (e) { figures.push(["operator metrics", e.message]); }
  try {
    // The node's gauges without labels (sizes of the model, Distro queues), read from its scrape.
    const text = await api("GET", "/nacos/actuator/prometheus");
    for (const line of String(text).split("\n")) {
      const g = /^(shoal_[a-z0-9_]+) ([0-9.eE+-]+)$/.exec(line);
      if (g && !g[1].endsWith("_created")) figures.push([g[1], Number(g[2])]);
    }
  } catch (e) { figures.push(["prometheus", e.message]); }
  document.getElementById("node-figures")?.replaceChildren(...figures.map(pair).flat());
}

function fmt(v) {
  if (v === undefined || v === null) return "";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

// --- router ------------------------------------------------------------------------------------------
async function render() {
  const { path, q } = route();
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.getAttribute("href") === `#${path}`);
  const logout = document.getElementById("logout");
  logout.hidden = !authOn() || !token();
  if (authOn() && !token() && path !== "/login") { location.hash = "#/login"; return; }
  try {
    if (path === "/login") loginPage();
    else if (path === "/service") await servicePage(q);
    else if (path === "/cluster") await clusterPage();
    else await servicesPage(q);
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 403)) flash(e.message, true);
  }
}

document.getElementById("logout").addEventListener("click", () => {
  localStorage.removeItem("token");
  location.hash = "#/login";
});

window.addEventListener("hashchange", () => { flashBox.replaceChildren(); render(); });
serverState = await api("GET", "/nacos/v1/console/server/state").catch(() => ({}));
render();

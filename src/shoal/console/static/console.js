// Shoal console: one vanilla module, no build step, no third-party code.
// Pages (hash routes): #/init (the first admin's password, on a node without one), #/login, #/services, #/service, #/cluster, #/namespaces, and for admins
// #/users, #/roles, #/permissions.
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
function login() {
  try { return JSON.parse(localStorage.getItem("token") || "{}"); } catch { return {}; }
}

function token() { return login().accessToken || ""; }

// Admin pages are offered when auth is off (everything is open) or the login is a global admin.
function isAdmin() { return !authOn() || login().globalAdmin === true; }

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
  // A missing, expired or unknown login goes back to the login page; a login that lacks the
  // permission ("authorization failed!") stays, and the page says what was refused.
  if (res.status === 403 && authOn() && !/authorization failed/i.test(text)) {
    localStorage.removeItem("token");
    location.hash = "#/login";
    const e = new ApiError(403, "please log in");
    e.loggedOut = true;
    throw e;
  }
  if (!res.ok) {
    let message = text;
    try { const j = JSON.parse(text); message = j.data || j.message || text; } catch { /* plain text */ }
    throw new ApiError(res.status, message);
  }
  try { return JSON.parse(text); } catch { return text; }
}

// Any API family behind a login (client, console or admin: Nacos 3.x's three switches).
function authOn() {
  return !!serverState && ["auth_enabled", "login_page_enabled", "auth_admin_enabled"].some((k) => serverState[k] === "true");
}

// Nacos 3.x's first visit: no admin yet, so the console asks for the admin's password.
function needsAdmin() { return !!serverState && serverState.auth_admin_request === "true"; }

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
      // An empty token: the client APIs are open and these credentials did not check out.
      if (!answer.accessToken) throw new Error("unknown user!");
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

// --- first admin (Nacos 3.x: the console sets the admin password on first visit) -----------------------
function initPage() {
  const pass = h("input", { id: "init-password", type: "password", autocomplete: "new-password", required: true });
  const again = h("input", { id: "init-password-again", type: "password", autocomplete: "new-password", required: true });
  const form = h("form", { class: "card login", id: "init-form" },
    h("h1", {}, "Set the admin password"),
    h("p", { class: "muted" }, "This node has no users yet. Choose the password of the admin user ",
      h("strong", {}, "nacos"), "; every API needs a login until then."),
    h("label", { for: "init-password" }, "Password"), pass,
    h("label", { for: "init-password-again" }, "Password again"), again,
    h("button", { class: "primary", id: "init-submit", type: "submit" }, "Create the admin"),
    h("p", { class: "muted" }, "For local development only, a node can run open instead: ",
      h("code", {}, "shoal server -D nacos.core.auth.enabled=false -D nacos.core.auth.admin.enabled=false "
        + "-D nacos.core.auth.console.enabled=false")));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (pass.value !== again.value) { flash("The two passwords differ.", true); return; }
    try {
      const made = await api("POST", "/nacos/v3/auth/user/admin", { password: pass.value });
      if (made.code !== 0) throw new ApiError(made.code, made.message);
      const answer = await api("POST", "/nacos/v1/auth/login", { username: made.data.username, password: pass.value });
      localStorage.setItem("token", JSON.stringify(answer));
      serverState = { ...serverState, auth_admin_request: "false" };
      flash(`Admin ${made.data.username} created; you are logged in.`);
      location.hash = "#/services";
    } catch (e) {
      flash(`Could not create the admin: ${e.message}`, true);
    }
  });
  main.replaceChildren(form);
  pass.focus();
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
    h("span", { id: "page-info" }, `Page ${page} of ${pages} · ${r.count} ${r.count === 1 ? "service" : "services"}`),
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
    h("span", { class: "muted" }, "Empty push"),
    h("span", { id: "empty-push" }, detail.service.emptyPushProtected ? "withheld (protected)" : "-"),
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

  // push lag per subscriber: change -> ack of its last push, p99 of its recent acks, unacked pushes
  const ms = (v) => (v === null || v === undefined ? "-" : `${v} ms`);
  const subRows = subs.subscribers.map((s) => {
    const lag = s.pushLag || {};
    const waiting = lag.pendingForMs ? ` (waiting ${lag.pendingForMs} ms)` : "";
    return h("tr", { dataset: { client: s.clientId || "" } },
      h("td", {}, s.addrStr), h("td", {}, s.app), h("td", {}, s.agent), h("td", {}, s.cluster || "(all)"),
      h("td", { class: "num last-lag" }, ms(lag.lastMs)), h("td", { class: "num p99-lag" }, ms(lag.p99Ms)),
      h("td", { class: "num pending" }, `${lag.pending ?? 0}${waiting}`));
  });
  if (!subRows.length) subRows.push(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No subscribers on this node.")));

  main.replaceChildren(
    h("h1", {}, h("a", { href: `#/services?${new URLSearchParams({ ns })}` }, "Services"), ` / ${group} / ${name}`),
    card, ...sections,
    h("h2", {}, `Subscribers · ${subs.count}`),
    h("table", { id: "subscribers" }, h("thead", {}, h("tr", {}, h("th", {}, "Address"), h("th", {}, "App"),
      h("th", {}, "Agent"), h("th", {}, "Clusters"), h("th", { class: "num" }, "Last push lag"),
      h("th", { class: "num" }, "p99 lag"), h("th", { class: "num" }, "Pushes pending"))), h("tbody", {}, subRows)));
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

// --- namespaces page -------------------------------------------------------------------------------
// Nacos's console rules, checked before anything is sent; the server checks again and its
// message (ILLEGAL_NAMESPACE, NAMESPACE_ALREADY_EXIST, ...) is shown as it says it.
const NS_ID = /^[\w-]+$/;
const NS_NAME_BAD = /[@#$%^&*]/;

function checkNamespace(id, name, desc) {
  if (id && !NS_ID.test(id)) return "Namespace ID may only contain letters, digits, '_' and '-'.";
  if (id && id.length > 128) return "Namespace ID is longer than 128 characters.";
  if (!name) return "Namespace name is required.";
  if (NS_NAME_BAD.test(name)) return "Namespace name may not contain @ # $ % ^ & *.";
  if (name.length > 256) return "Namespace name is longer than 256 characters.";
  if (desc && desc.length > 256) return "Description is longer than 256 characters.";
  return "";
}

async function namespacesPage() {
  const r = await api("GET", "/nacos/v1/console/namespaces");
  const list = (Array.isArray(r) ? r : r.data) || [];
  const reload = () => namespacesPage().catch((e) => flash(e.message, true));
  const idIn = h("input", { id: "ns-id", placeholder: "ID (optional: a UUID is made)", size: 30 });
  const nameIn = h("input", { id: "ns-name", placeholder: "name", required: true });
  const descIn = h("input", { id: "ns-desc", placeholder: "description", size: 40 });
  const create = h("form", { class: "toolbar card", id: "ns-create", onsubmit: async (e) => {
    e.preventDefault();
    const id = idIn.value.trim(), name = nameIn.value.trim(), desc = descIn.value.trim();
    const problem = checkNamespace(id, name, desc);
    if (problem) { flash(problem, true); return; }
    try {
      await api("POST", "/nacos/v2/console/namespace", { namespaceId: id || undefined, namespaceName: name,
        namespaceDesc: desc });
      flash(`Namespace ${name} created.`);
      reload();
    } catch (err) { flash(`Creating the namespace failed: ${err.message}`, true); }
  } }, h("strong", {}, "New namespace"), idIn, nameIn, descIn,
  h("button", { class: "primary", type: "submit", id: "ns-create-submit" }, "Create"));
  const rows = list.map((n) => {
    const id = n.namespace || "public";
    const isPublic = n.type === 0 || id === "public" || id === "";
    const nameCell = h("td", { class: "ns-name" }, n.namespaceShowName);
    const descCell = h("td", { class: "ns-desc" }, n.namespaceDesc || "");
    const actions = h("td", { class: "actions" });
    const row = h("tr", { dataset: { namespace: id } }, h("td", { class: "mono" }, id), nameCell, descCell, actions);
    const services = h("a", { href: `#/services?${new URLSearchParams({ ns: id })}` }, "Services");
    if (isPublic) { actions.append(services, " ", h("span", { class: "muted" }, "(built in)")); return row; }
    if (!isAdmin()) { actions.append(services); return row; }
    const edit = h("button", { class: "edit", onclick: () => {
      const nameEdit = h("input", { class: "ns-name-input", value: n.namespaceShowName });
      const descEdit = h("input", { class: "ns-desc-input", value: n.namespaceDesc || "", size: 40 });
      nameCell.replaceChildren(nameEdit);
      descCell.replaceChildren(descEdit);
      actions.replaceChildren(h("button", { class: "primary save", onclick: async () => {
        const problem = checkNamespace("", nameEdit.value.trim(), descEdit.value.trim());
        if (problem) { flash(problem, true); return; }
        try {
          await api("PUT", "/nacos/v2/console/namespace", { namespaceId: id, namespaceName: nameEdit.value.trim(),
            namespaceDesc: descEdit.value.trim() });
          flash(`Namespace ${id} saved.`);
          reload();
        } catch (err) { flash(`Saving the namespace failed: ${err.message}`, true); }
      } }, "Save"), " ", h("button", { onclick: reload }, "Cancel"));
      nameEdit.focus();
    } }, "Edit");
    const del = h("button", { class: "danger delete", onclick: async () => {
      if (!confirm(`Delete namespace ${n.namespaceShowName} (${id})? Its services stay registered until their clients leave.`)) return;
      try {
        await api("DELETE", "/nacos/v2/console/namespace", { namespaceId: id });
        flash(`Namespace ${id} deleted.`);
        reload();
      } catch (err) { flash(`Deleting the namespace failed: ${err.message}`, true); }
    } }, "Delete");
    actions.append(services, " ", edit, " ", del);
    return row;
  });
  main.replaceChildren(h("h1", {}, `Namespaces · ${list.length}`), isAdmin() ? create : "",
    h("table", { id: "namespaces" }, h("thead", {}, h("tr", {}, h("th", {}, "ID"), h("th", {}, "Name"),
      h("th", {}, "Description"), h("th", {}, ""))), h("tbody", {}, rows)));
}

// --- users, roles and permissions (admins) -------------------------------------------------------
function pageOf(r) { return { items: r.pageItems || [], total: r.totalCount ?? (r.pageItems || []).length }; }

// A <datalist> fed by the search endpoints, so names can be picked while typing.
function suggest(input, path, param) {
  const list = h("datalist", { id: `${input.id}-list` });
  input.setAttribute("list", list.id);
  let last = null;
  input.addEventListener("input", async () => {
    const text = input.value.trim();
    if (text === last) return;
    last = text;
    try {
      const names = await api("GET", path, { [param]: text });
      if (input.value.trim() === text) list.replaceChildren(...names.slice(0, 20).map((n) => h("option", { value: n })));
    } catch { /* suggestions are optional */ }
  });
  return list;
}

async function usersPage() {
  const [r, bindings] = await Promise.all([
    api("GET", "/nacos/v1/auth/users", { pageNo: 1, pageSize: 1000 }).then(pageOf),
    api("GET", "/nacos/v1/auth/roles", { pageNo: 1, pageSize: 10000 }).then(pageOf)]);
  const rolesOf = new Map();
  for (const b of bindings.items) rolesOf.set(b.username, [...(rolesOf.get(b.username) || []), b.role]);
  const reload = () => usersPage().catch((e) => flash(e.message, true));
  const user = h("input", { id: "user-name", placeholder: "username", autocomplete: "off" });
  const pass = h("input", { id: "user-password", type: "password", placeholder: "password", autocomplete: "new-password" });
  const create = h("form", { class: "toolbar card", id: "user-create", onsubmit: async (e) => {
    e.preventDefault();
    try {
      await api("POST", "/nacos/v1/auth/users", { username: user.value.trim(), password: pass.value });
      flash(`User ${user.value.trim()} created.`);
      reload();
    } catch (err) { flash(`Creating the user failed: ${err.message}`, true); }
  } }, h("strong", {}, "New user"), user, pass, h("button", { class: "primary", type: "submit", id: "user-create-submit" }, "Create"));
  const rows = r.items.map((u) => {
    const pw = h("input", { class: "new-password", type: "password", placeholder: "new password", autocomplete: "new-password" });
    const roles = rolesOf.get(u.username) || [];
    const admin = roles.includes("ROLE_ADMIN");
    return h("tr", { dataset: { user: u.username } }, h("td", {}, u.username),
      h("td", {}, roles.length ? roles.map((role) => h("span", { class: "tag" }, role)) : h("span", { class: "muted" }, "none")),
      h("td", {}, pw, " ", h("button", { class: "change-password", onclick: async () => {
        try {
          await api("PUT", "/nacos/v1/auth/users", { username: u.username, newPassword: pw.value });
          flash(`Password of ${u.username} changed.`);
          pw.value = "";
        } catch (err) { flash(`Changing the password failed: ${err.message}`, true); }
      } }, "Change password")),
      h("td", {}, admin ? h("span", { class: "muted" }, "(admin)") : h("button", { class: "danger delete", onclick: async () => {
        if (!confirm(`Delete user ${u.username}?`)) return;
        try {
          await api("DELETE", "/nacos/v1/auth/users", { username: u.username });
          flash(`User ${u.username} deleted.`);
          reload();
        } catch (err) { flash(`Deleting the user failed: ${err.message}`, true); }
      } }, "Delete")));
  });
  main.replaceChildren(h("h1", {}, `Users · ${r.total}`), create,
    h("table", { id: "users" }, h("thead", {}, h("tr", {}, h("th", {}, "Username"), h("th", {}, "Roles"), h("th", {}, "Password"),
      h("th", {}, ""))), h("tbody", {}, rows)));
  user.focus();
}

async function rolesPage() {
  const r = pageOf(await api("GET", "/nacos/v1/auth/roles", { pageNo: 1, pageSize: 1000 }));
  const reload = () => rolesPage().catch((e) => flash(e.message, true));
  const role = h("input", { id: "role-name", placeholder: "role", autocomplete: "off" });
  const user = h("input", { id: "role-user", placeholder: "username", autocomplete: "off" });
  const bind = h("form", { class: "toolbar card", id: "role-bind", onsubmit: async (e) => {
    e.preventDefault();
    try {
      await api("POST", "/nacos/v1/auth/roles", { role: role.value.trim(), username: user.value.trim() });
      flash(`Role ${role.value.trim()} bound to ${user.value.trim()}.`);
      reload();
    } catch (err) { flash(`Binding the role failed: ${err.message}`, true); }
  } }, h("strong", {}, "Bind a role"), role, suggest(role, "/nacos/v1/auth/roles/search", "role"),
  h("span", { class: "muted" }, "to"), user, suggest(user, "/nacos/v1/auth/users/search", "username"),
  h("button", { class: "primary", type: "submit", id: "role-bind-submit" }, "Bind"));
  const rows = r.items.map((b) => h("tr", { dataset: { role: b.role, user: b.username } },
    h("td", {}, b.role), h("td", {}, b.username),
    h("td", {}, b.role === "ROLE_ADMIN" ? h("span", { class: "muted" }, "(built in)") :
      h("button", { class: "danger unbind", onclick: async () => {
        try {
          await api("DELETE", "/nacos/v1/auth/roles", { role: b.role, username: b.username });
          flash(`Role ${b.role} unbound from ${b.username}.`);
          reload();
        } catch (err) { flash(`Unbinding the role failed: ${err.message}`, true); }
      } }, "Unbind"))));
  main.replaceChildren(h("h1", {}, `Roles · ${r.total} bindings`), bind,
    h("table", { id: "roles" }, h("thead", {}, h("tr", {}, h("th", {}, "Role"), h("th", {}, "User"),
      h("th", {}, ""))), h("tbody", {}, rows)));
}

async function permissionsPage() {
  const r = pageOf(await api("GET", "/nacos/v1/auth/permissions", { pageNo: 1, pageSize: 1000 }));
  const reload = () => permissionsPage().catch((e) => flash(e.message, true));
  const role = h("input", { id: "perm-role", placeholder: "role", autocomplete: "off" });
  const nsSel = h("select", { id: "perm-namespace" });
  const resource = h("input", { id: "perm-resource", placeholder: "resource", size: 36,
    title: "namespace:group:naming/service, * as a wildcard (e.g. dev:*:*)" });
  const action = h("select", { id: "perm-action" }, h("option", { value: "r" }, "read"),
    h("option", { value: "w" }, "write"), h("option", { value: "rw" }, "read + write"));
  namespaces().then((list) => {
    nsSel.replaceChildren(h("option", { value: "" }, "namespace…"), ...list.map((n) => h("option", { value: n.id }, n.name)));
  }).catch(() => {});
  nsSel.addEventListener("change", () => { if (nsSel.value) resource.value = `${nsSel.value}:*:*`; });
  const grant = h("form", { class: "toolbar card", id: "perm-grant", onsubmit: async (e) => {
    e.preventDefault();
    try {
      await api("POST", "/nacos/v1/auth/permissions", { role: role.value.trim(), resource: resource.value.trim(),
        action: action.value });
      flash(`Granted ${action.selectedOptions[0].textContent} on ${resource.value.trim()} to ${role.value.trim()}.`);
      reload();
    } catch (err) { flash(`Granting failed: ${err.message}`, true); }
  } }, h("strong", {}, "Grant"), action, h("span", { class: "muted" }, "on"), nsSel, resource,
  h("span", { class: "muted" }, "to"), role, suggest(role, "/nacos/v1/auth/roles/search", "role"),
  h("button", { class: "primary", type: "submit", id: "perm-grant-submit" }, "Grant"));
  const names = { r: "read", w: "write", rw: "read + write" };
  const rows = r.items.map((p) => h("tr", { dataset: { role: p.role, resource: p.resource } },
    h("td", {}, p.role), h("td", { class: "mono" }, p.resource), h("td", {}, names[p.action] || p.action),
    h("td", {}, h("button", { class: "danger revoke", onclick: async () => {
      try {
        await api("DELETE", "/nacos/v1/auth/permissions", { role: p.role, resource: p.resource, action: p.action });
        flash(`Revoked ${names[p.action] || p.action} on ${p.resource} from ${p.role}.`);
        reload();
      } catch (err) { flash(`Revoking failed: ${err.message}`, true); }
    } }, "Revoke"))));
  main.replaceChildren(h("h1", {}, `Permissions · ${r.total}`), grant,
    h("table", { id: "permissions" }, h("thead", {}, h("tr", {}, h("th", {}, "Role"), h("th", {}, "Resource"),
      h("th", {}, "Action"), h("th", {}, ""))), h("tbody", {}, rows)));
}

// --- cluster ---------------------------------------------------------------------------------------
function ago(ms) {
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

function stamped(ms, text, cls = "") {
  if (!ms) return h("span", { class: "muted" }, "—");
  return h("span", { class: cls, title: new Date(ms).toISOString() }, text ? `${text} · ${ago(ms)}` : ago(ms));
}

function stateClass(state) { return state === "UP" ? "good" : state === "SUSPICIOUS" ? "warn" : "bad"; }

function memberRow(m) {
  const v = m.lastVerify;
  const verifyCls = !v ? "" : v.result === "ok" || v.result === "repaired" ? "good" : v.result === "skipped" ? "muted" : "bad";
  const verifyText = !v ? "" : v.result === "repaired" ? `repaired ${v.resynced}` : v.result;
  const none = (x) => (x === null || x === undefined ? h("span", { class: "muted" }, "—") : x);
  return h("tr", { dataset: { member: m.address }, class: m.self ? "self" : "" },
    h("td", {}, m.address, m.self ? h("span", { class: "tag" }, "this node") : ""),
    h("td", { class: stateClass(m.state) }, m.state),
    h("td", { class: "num clients-owned" }, m.clientsOwned),
    h("td", { class: "num sync-queue" }, none(m.syncQueue), m.needsFullVerify ? h("div", { class: "warn small" }, "needs full verify") : ""),
    h("td", { class: "num" }, m.self ? none(null) : `${m.syncBatchesSent} / ${m.syncBatchesFailed}`),
    h("td", {}, m.self ? none(null) : stamped(m.lastSync, "")),
    h("td", { class: "last-verify" }, m.self ? none(null) : v ? [stamped(v.time, verifyText, verifyCls),
      v.detail ? h("div", { class: "small muted" }, v.detail) : ""] : h("span", { class: "muted" }, "not yet")),
    h("td", { class: "last-failure" }, m.self ? none(null) : [
      m.lastSyncFailure ? failure(m.lastSyncFailure, m.lastSeen) : "",
      m.lastFailure && (!m.lastSyncFailure || m.lastFailure.time !== m.lastSyncFailure.time) ? failure(m.lastFailure, m.lastSeen) : "",
      !m.lastSyncFailure && !m.lastFailure ? h("span", { class: "muted" }, "none") : ""]));
}

// A failure the member has answered since is history (muted); one it has not is current (red).
function failure(f, lastSeen) {
  const past = lastSeen && lastSeen > f.time;
  return h("div", { class: past ? "failure past" : "failure" },
    stamped(f.time, past ? "recovered since" : "", past ? "muted" : "bad"), h("div", { class: "small" }, f.reason));
}

// The member table follows the cluster while the page is open: re-read every few seconds.
const MEMBERS_REFRESH_MS = 3000;

function refreshMembers(tbody) {
  setTimeout(async () => {
    if (!tbody.isConnected || document.hidden) { if (tbody.isConnected) refreshMembers(tbody); return; }
    try {
      const figures = await api("GET", "/nacos/v1/console/cluster/distro");
      if (!tbody.isConnected) return;
      tbody.replaceChildren(...figures.members.map(memberRow));
      const up = figures.members.filter((m) => m.state === "UP").length;
      const title = document.querySelector("main h1");
      if (title) title.textContent = `Cluster · ${figures.members.length} ${figures.members.length === 1 ? "member" : "members"} · ${up} up`;
      const v = figures.verify, totals = document.getElementById("verify-totals");
      if (v && totals) totals.textContent = `Verify: ${v.rounds} rounds, ${v.requests} requests, ${v.bytes} bytes sent, ${v.repairs} clients repaired.`;
    } catch { /* the next tick tries again */ }
    if (tbody.isConnected) refreshMembers(tbody);
  }, MEMBERS_REFRESH_MS);
}

async function clusterPage() {
  if (!isAdmin()) {  // the member list and the Distro figures are admin APIs: say so, not "Loading…"
    main.replaceChildren(h("h1", {}, "Cluster"), h("p", { class: "muted", id: "cluster-admin-only" },
      `The cluster's members and figures are shown to admins only; ${login().username || "this login"} is not one.`));
    return;
  }
  let figures = null;
  try { figures = await api("GET", "/nacos/v1/console/cluster/distro"); } catch (e) { flash(`Distro figures: ${e.message}`, true); }
  let members = figures ? figures.members : null;
  if (!members) {  // an older node: the member list alone
    const nodes = await api("GET", "/nacos/v1/core/cluster/nodes", {});
    members = (nodes.data || []).map((m) => ({ address: m.address, state: m.state, self: false, clientsOwned: "" }));
  }
  const pair = ([k, v]) => [h("span", { class: "muted" }, k), h("span", {}, fmt(v))];
  const up = members.filter((m) => m.state === "UP").length;
  const node = (figures && figures.node) || {};
  const verify = figures && figures.verify;
  const settings = (node.settings || []).map((s) => h("tr", { class: s.changed ? "changed" : "", title: s.doc || "" },
    h("td", { class: "mono" }, s.property), h("td", { class: "mono" }, fmt(s.value)),
    h("td", { class: "mono muted" }, s.changed ? fmt(s.default) : "")));
  main.replaceChildren(h("h1", {}, `Cluster · ${members.length} ${members.length === 1 ? "member" : "members"} · ${up} up`),
    h("p", { class: "muted" }, figures && !figures.standalone
      ? `As ${figures.self} sees it${figures.loaded ? "" : " (still loading its snapshot)"}.`
      : "A standalone node."),
    h("h2", { id: "charts-title" }, "The last minutes"),
    h("div", { class: "charts", id: "charts" }, h("span", { class: "muted" }, "loading…")),
    h("h2", {}, "Members"),
    h("table", { id: "members" }, h("thead", {}, h("tr", {}, h("th", {}, "Member"), h("th", {}, "State"),
      h("th", { class: "num" }, "Clients owned"), h("th", { class: "num" }, "Sync queue"),
      h("th", { class: "num" }, "Batches sent / failed"), h("th", {}, "Last sync"), h("th", {}, "Last verify"),
      h("th", {}, "Last failure"))), h("tbody", {}, members.map(memberRow))),
    verify ? h("p", { class: "muted", id: "verify-totals" }, `Verify: ${verify.rounds} rounds, ${verify.requests} requests, `
      + `${verify.bytes} bytes sent, ${verify.repairs} clients repaired.`) : "",
    h("h2", {}, "This node: transport and kernels"),
    h("div", { class: "card grid", id: "node-state" }, Object.entries(serverState || {}).map(pair).flat()),
    h("h2", {}, "This node: settings in effect"),
    h("p", { class: "muted small" }, "Distro and membership settings, and every other setting changed from its default (highlighted)."),
    h("table", { id: "settings" }, h("thead", {}, h("tr", {}, h("th", {}, "Property"), h("th", {}, "Value"),
      h("th", {}, "Default"))), h("tbody", {}, settings)),
    h("h2", {}, "This node: registry figures"),
    h("div", { class: "card grid", id: "node-figures" }, h("span", { class: "muted" }, "loading…")));
  if (figures) refreshMembers(document.querySelector("#members tbody"));
  refreshCharts(document.getElementById("charts"), true);
  (document.getElementById("verify-totals") || document.getElementById("members")).after(...consistencyPanel());
  const registry = [];
  try {
    const m = await api("GET", "/nacos/v1/ns/operator/metrics", { onlyStatus: false });
    for (const [k, v] of Object.entries(m)) registry.push([k, v]);
  } catch (e) { registry.push(["operator metrics", e.message]); }
  try {
    // The node's gauges without labels (sizes of the model, Distro queues), read from its scrape.
    const text = await api("GET", "/nacos/actuator/prometheus");
    for (const line of String(text).split("\n")) {
      const g = /^(shoal_[a-z0-9_]+) ([0-9.eE+-]+)$/.exec(line);
      if (g && !g[1].endsWith("_created")) registry.push([g[1], Number(g[2])]);
    }
  } catch (e) { registry.push(["prometheus", e.message]); }
  document.getElementById("node-figures")?.replaceChildren(...registry.map(pair).flat());
}

// --- cluster: charts (issue 23 item 6) ----------------------------------------------------------
// The node samples its figures every shoal.console.chart.interval-ms into a ring buffer
// (GET /nacos/v1/console/cluster/charts); the page draws them as inline SVG line charts, its own
// code, no library, and re-reads them every interval while it is open.
const SVG_NS = "http://www.w3.org/2000/svg";
const CHART_COLORS = ["#1f6feb", "#2e7d32", "#b26a00", "#8e24aa", "#c62828", "#00838f", "#5d4037", "#3949ab"];
const KIND_NAMES = { grpc: "gRPC (SDK)", http: "HTTP", cluster: "cluster port (peers)" };

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// The smallest of 1, 2, 2.5, 5 × 10^n at or above v (the top of the y axis).
function niceTop(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((t) => t >= v * (1 - 1e-9));
}

function num(v) {
  if (v === null || v === undefined) return "—";
  const a = Math.abs(v);
  return String(a >= 100 ? Math.round(v) : a >= 10 ? Number(v.toFixed(1)) : Number(v.toFixed(2)));
}

function hms(ms) { return new Date(ms).toLocaleTimeString([], { hour12: false }); }

// One line chart: series [{name, points: [[time ms, value or null]]}]; a null is a gap. `empty`
// is written in the plot while it has no value; `note` under it always.
function lineChart(id, title, unit, series, t0, t1, empty = "no data yet", note = "") {
  const W = 440, H = 160, L = 48, R = 12, T = 10, B = 22;
  const values = series.flatMap((se) => se.points.map((p) => p[1]).filter((v) => v !== null && v !== undefined));
  const max = values.length ? Math.max(...values) : 0;
  const top = niceTop(max);
  const x = (t) => L + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart-svg", role: "img", "aria-label": title });
  for (const f of [0, 0.5, 1]) {
    const yy = y(top * f);
    plot.append(svg("line", { x1: L, x2: W - R, y1: yy, y2: yy, class: f ? "grid" : "axis" }),
      svg("text", { x: L - 5, y: yy + 4, class: "ylabel", "text-anchor": "end" }, num(top * f)));
  }
  plot.append(svg("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }),
    svg("text", { x: L, y: H - 5, class: "xlabel" }, hms(t0)),
    svg("text", { x: W - R, y: H - 5, class: "xlabel", "text-anchor": "end" }, hms(t1)));
  if (!values.length) {
    plot.append(svg("text", { x: (L + W - R) / 2, y: (T + H - B) / 2, class: "nodata", "text-anchor": "middle" }, empty));
  }
  const keys = series.map((se, i) => {
    const color = CHART_COLORS[i % CHART_COLORS.length];
    let d = "", n = 0, run = [], last = null;
    const dots = [];  // a point with no neighbour (a gap either side) is a dot: a path would not show it
    const endRun = () => { if (run.length === 1) dots.push(run[0]); run = []; };
    for (const [t, v] of se.points) {
      if (v === null || v === undefined) { endRun(); continue; }
      d += `${run.length ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      run.push([t, v]); n += 1; last = [t, v];
    }
    endRun();
    if (d) plot.append(svg("path", { d, class: "line", stroke: color, "data-series": se.name, "data-points": n }));
    for (const [t, v] of dots) plot.append(svg("circle", { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2, fill: color, class: "dot" }));
    if (last) plot.append(svg("circle", { cx: x(last[0]).toFixed(1), cy: y(last[1]).toFixed(1), r: 2.5, fill: color, class: "last-dot" }));
    return h("span", { class: "key", dataset: { series: se.name } }, h("i", { style: `background:${color}` }),
      `${se.name} `, h("b", { class: "last" }, last ? num(last[1]) : "—"));
  });
  return h("div", { class: "card chart", id, dataset: { max: String(max), points: String(values.length) } },
    h("div", { class: "chart-title" }, title, h("span", { class: "muted" }, unit ? ` · ${unit}` : "")),
    plot, h("div", { class: "legend" }, keys), note ? h("div", { class: "small muted" }, note) : "");
}

function drawCharts(box, data) {
  const samples = data.samples || [];
  const minutes = Math.round(data.windowMs / 60000);
  const every = data.intervalMs >= 1000 ? `${data.intervalMs / 1000} s` : `${data.intervalMs} ms`;
  const title = document.getElementById("charts-title");
  if (title) title.textContent = `The last ${minutes >= 1 ? `${minutes} min` : `${Math.round(data.windowMs / 1000)} s`} · one sample every ${every}`;
  const now = samples.length ? samples[samples.length - 1].time : Date.now();
  const t0 = Math.min(samples.length ? samples[0].time : now, now), t1 = now;
  const line = (name, get) => ({ name, points: samples.map((s) => [s.time, get(s)]) });
  // before the first sample, every chart says when it comes (a node's first one: one interval after its start)
  const empty = (text) => (samples.length ? text : `the first sample comes within ${every}`);
  const kinds = [...new Set(samples.flatMap((s) => Object.keys(s.requests || {})))].sort();
  const peers = [...new Set(samples.flatMap((s) => Object.keys(s.sync || {})))].sort();
  box.replaceChildren(
    lineChart("chart-requests", "Requests per second, by kind", "req/s",
      kinds.map((k) => line(KIND_NAMES[k] || k, (s) => (s.requests || {})[k] ?? 0)), t0, t1, empty("no data yet")),
    lineChart("chart-push-p99", "Push lag p99, change → ack", "ms",
      [line("p99", (s) => s.pushP99Ms)], t0, t1, empty("no push acked yet")),
    lineChart("chart-connections", "SDK connections", "", [line("connections", (s) => s.connections)], t0, t1,
      empty("no data yet")),
    lineChart("chart-instances", "Instances held", "", [line("instances", (s) => s.instances)], t0, t1,
      empty("no data yet")),
    lineChart("chart-sync", "Distro sync queue per member", "clients waiting",
      peers.map((p) => line(p, (s) => (s.sync && s.sync[p] ? s.sync[p].pending : null))), t0, t1,
      empty(peers.length ? "no data yet" : "no peers: a standalone node")),
    lineChart("chart-disagreements", "Services in disagreement", "services",
      [line("services", (s) => s.disagreements)], t0, t1, empty("no consistency check run yet"),
      "at the last consistency check (the panel below, or every shoal.consistency.check-interval-ms)"));
}

function refreshCharts(box, now = false) {
  let delay = 1000;
  const run = async () => {
    if (!box.isConnected) return;
    if (!document.hidden) {
      try {
        const data = await api("GET", "/nacos/v1/console/cluster/charts");
        if (!box.isConnected) return;
        drawCharts(box, data);
        delay = Math.max(500, data.intervalMs || 1000);
      } catch (e) {
        if (box.isConnected) box.replaceChildren(h("span", { class: "bad" }, `Charts: ${e.message}`));
      }
    }
    if (box.isConnected) setTimeout(run, delay);
  };
  if (now) run(); else setTimeout(run, delay);
}

// --- cluster: consistency panel (issue 23 item 4) -------------------------------------------------
// Asks this node to compare every member's digest of each service (GET /nacos/v1/shoal/consistency);
// a difference is reported only when it shows again a moment later (a write in flight is not one).
function consistencyPanel() {
  const out = h("div", { class: "card", id: "consistency" }, h("span", { class: "muted" }, "checking…"));
  const run = async () => {
    out.replaceChildren(h("span", { class: "muted" }, "checking…"));
    let r;
    try { r = await api("GET", "/nacos/v1/shoal/consistency"); } catch (e) {
      out.replaceChildren(h("span", { class: "bad" }, `Consistency check: ${e.message}`)); return;
    }
    const n = r.members.length, plural = (k, w) => `${k} ${w}${k === 1 ? "" : "s"}`;
    if (r.agree) {
      out.replaceChildren(h("span", { class: "good" }, `All ${plural(n, "member")} agree on ${plural(r.services, "service")}.`));
      return;
    }
    out.replaceChildren(
      ...r.unanswered.map((m) => h("div", { class: "bad", dataset: { member: m } }, `${m} does not answer`)),
      r.disagree.length ? h("table", { id: "disagreements" }, h("thead", {}, h("tr", {}, h("th", {}, "Service"),
        h("th", {}, "Members and what they hold"))), h("tbody", {}, r.disagree.map((d) => h("tr", { dataset: { service: d.service } },
        h("td", { class: "mono" }, d.service),
        h("td", {}, d.groups.map((g) => h("div", {}, `${g.members.join(", ")}: `,
          g.digest === "absent" ? h("span", { class: "bad" }, "not there") : `${plural(g.instances, "instance")} (${g.digest})`))))))) : "",
      h("p", { class: "muted small" }, `${n - r.unanswered.length} of ${n} members answered; `
        + `they disagree on ${r.disagree.length} of ${plural(r.services, "service")}.`));
  };
  run();
  return [h("h2", {}, "Consistency"), out, h("button", { type: "button", id: "consistency-check", onclick: run }, "Check again")];
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
  document.getElementById("who").textContent = authOn() && token() ? login().username || "" : "";
  for (const id of ["nav-users", "nav-roles", "nav-permissions"]) {
    document.getElementById(id).hidden = !(authOn() && token() && isAdmin());
  }
  document.getElementById("nav-cluster").hidden = !isAdmin();
  if (needsAdmin() && path !== "/init") { location.hash = "#/init"; return; }
  if (authOn() && !token() && path !== "/login" && path !== "/init") { location.hash = "#/login"; return; }
  try {
    if (path === "/init") initPage();
    else if (path === "/login") loginPage();
    else if (path === "/service") await servicePage(q);
    else if (path === "/cluster") await clusterPage();
    else if (path === "/namespaces") await namespacesPage();
    else if (path === "/users" && isAdmin()) await usersPage();
    else if (path === "/roles" && isAdmin()) await rolesPage();
    else if (path === "/permissions" && isAdmin()) await permissionsPage();
    else await servicesPage(q);
  } catch (e) {
    if (!(e instanceof ApiError && e.loggedOut)) flash(e.status === 403 ? `Not allowed: ${e.message}` : e.message, true);
  }
}

document.getElementById("logout").addEventListener("click", () => {
  localStorage.removeItem("token");
  location.hash = "#/login";
});

window.addEventListener("hashchange", () => { flashBox.replaceChildren(); render(); });
serverState = await api("GET", "/nacos/v1/console/server/state").catch(() => ({}));
render();

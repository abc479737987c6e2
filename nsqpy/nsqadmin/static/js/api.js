// The JSON API under the base path (document.baseURI comes from <base href>).

export class ApiError extends Error {
  constructor(status, message, { aborted = false } = {}) {
    super(message);
    this.status = status;
    this.aborted = aborted; // cut short by leavePage(): nothing to report
  }
}

export function apiURL(path) {
  return new URL(path.replace(/^\//, ""), document.baseURI).toString();
}

export const enc = encodeURIComponent;

// A host:port in a path: ':' is allowed there and reads better unescaped.
export const encNode = (node) => encodeURIComponent(node).replace(/%3A/gi, ":");

// A page's GETs are its own: leaving it (main.js) aborts those still in flight, so that a
// late answer about what it showed (a topic just deleted: 502 TOPIC_NOT_FOUND) is neither
// an error nor drawn. Actions (POST, DELETE) are never cut short; while one runs, the
// page's GETs are aborted and its refreshes wait (duringAction), for the same reason.
let pageRequests = new AbortController();
let actions = 0;

export function leavePage() {
  pageRequests.abort();
  pageRequests = new AbortController();
}

export const actionRunning = () => actions > 0;

export async function duringAction(call) {
  actions += 1;
  leavePage();
  try {
    return await call();
  } finally {
    actions -= 1;
  }
}

async function request(method, path, body) {
  const init = {
    method,
    credentials: "same-origin",
    headers: { Accept: "application/vnd.nsq; version=1.0" },
  };
  if (method === "GET") init.signal = pageRequests.signal;
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let response;
  let text;
  try {
    response = await fetch(apiURL(path), init);
    text = await response.text();
  } catch (err) {
    if (err.name === "AbortError") throw new ApiError(0, "aborted", { aborted: true });
    throw new ApiError(0, `nsqadmin is unreachable (${err.message})`);
  }
  let doc = null;
  if (text) {
    try {
      doc = JSON.parse(text);
    } catch {
      doc = null;
    }
  }
  if (!response.ok) {
    const message = (doc && doc.message) || `${response.status} ${response.statusText}`;
    throw new ApiError(response.status, message);
  }
  return doc;
}

export const get = (path) => request("GET", path);
export const post = (path, body) => request("POST", path, body);
export const del = (path, body) => request("DELETE", path, body);

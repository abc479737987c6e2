// The JSON API under the base path (document.baseURI comes from <base href>).

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function apiURL(path) {
  return new URL(path.replace(/^\//, ""), document.baseURI).toString();
}

export const enc = encodeURIComponent;

// A host:port in a path: ':' is allowed there and reads better unescaped.
export const encNode = (node) => encodeURIComponent(node).replace(/%3A/gi, ":");

async function request(method, path, body) {
  const init = {
    method,
    credentials: "same-origin",
    headers: { Accept: "application/vnd.nsq; version=1.0" },
  };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(apiURL(path), init);
  } catch (err) {
    throw new ApiError(0, `nsqadmin is unreachable (${err.message})`);
  }
  const text = await response.text();
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

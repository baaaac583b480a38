// What the built site's search finds, run as a browser runs it: the pages' worker (docs/assets/
// search-worker.js, which loads Material's) on the site's search index, in node.
//   node .ci/site_search.js SITE_DIR QUERY...
// Prints the pages each query finds; exits 1 when one finds none, or when the pages do not use that worker.
"use strict";
const fs = require("fs"), path = require("path"), vm = require("vm"), { pathToFileURL, fileURLToPath } = require("url");

const [site, ...queries] = process.argv.slice(2);
const page = fs.readFileSync(path.join(site, "index.html"), "utf8");
if (!page.includes("assets/search-worker.js")) {
  console.error(`${site}/index.html does not run the search through assets/search-worker.js`);
  process.exit(1);
}
const workers = path.join(site, "assets", "javascripts", "workers");
const material = pathToFileURL(path.join(workers, fs.readdirSync(workers).find(f => /^search\..*\.js$/.test(f))));
const worker = pathToFileURL(path.join(site, "assets", "search-worker.js"));
worker.searchParams.set("material", material.href);

let handler;
const replies = [];
const scope = {
  console, URL,
  location: { href: worker.href },
  addEventListener: (type, fn) => { if (type === "message") handler = fn; },
  postMessage: message => replies.push(message),
  importScripts: (...urls) => urls.forEach(url => vm.runInContext(fs.readFileSync(fileURLToPath(url), "utf8"), scope)),
};
scope.self = scope;
vm.createContext(scope);
vm.runInContext(fs.readFileSync(worker, "utf8"), scope);

(async () => {
  const index = JSON.parse(fs.readFileSync(path.join(site, "search", "search_index.json"), "utf8"));
  await handler({ data: { type: 0, data: { ...index, options: { suggest: false } } } });
  let missed = 0;
  for (const query of queries) {
    replies.length = 0;
    await handler({ data: { type: 2, data: query } });
    const found = replies.flatMap(reply => (reply.data.items || []).map(group => group[0].location || "(home)"));
    console.log(`search ${JSON.stringify(query)}: ${found.length} pages${found.length ? ", first " + found.slice(0, 3).join(", ") : ""}`);
    missed += found.length === 0;
  }
  process.exit(missed ? 1 : 0);
})();

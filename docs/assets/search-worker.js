// Material's search worker, with one change: an option as the pages write it ("--ptn-backend") is searched
// as its words, each required ("+ptn +backend"). To lunr's query syntax a leading "-" means "must not
// contain", so the option as typed was a query error that found nothing. docs/overrides/main.html makes the
// pages use this worker, the address of Material's own in ?material=; .ci/site_search.js checks what it finds.
const listen = self.addEventListener.bind(self);
self.addEventListener = (type, handler, ...rest) =>
  listen(type, type !== "message" ? handler : event => {
    const message = event.data;
    if (typeof message.data !== "string")  // the index to set up; a query is a string
      return handler(event);
    const query = message.data.replace(/(^|\s)-{2,}([^\s-]\S*)/g, (_, before, option) =>
      before + option.split(/-+/).filter(Boolean).map(word => "+" + word).join(" "));
    return handler({ data: { ...message, data: query } });
  }, ...rest);
importScripts(new URL(location.href).searchParams.get("material"));

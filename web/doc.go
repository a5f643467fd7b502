// Package web is the operator console: server-rendered pages (html/template, assets
// embedded, no build step) and a JSON API under /api/v1/ over the inspect package,
// the same structs the CLI prints with --json.
//
// It is safe by default: write actions (requeue, purge, force release) need the
// bearer token, or a browser session signed in with it, and are refused when no
// token is configured; forms carry a CSRF token and are refused from another origin;
// every response carries a Content-Security-Policy that allows no inline script;
// everything shown passes html/template's escaping and the redactor of the
// process's secrets; bad input gets a 4xx page naming what is wrong.
package web

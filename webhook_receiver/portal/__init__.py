"""The merchant portal: each endpoint owner (a tenant) sees and fixes its own webhooks,
inside the host, through one-use links or the host's own login
(docs/sending.md#the-merchant-portal).

- access.py: links, sessions, revocation, the audit and its rate limit;
- guard.py: how a request reaches it (cookie or bearer), capabilities, its headers;
- actions.py: what a session reads and does, for the pages and the API alike;
- pages/: the server-rendered pages; api/: the JSON API (DRF);
- urls.py: both, mounted by the host.
"""

"""The portal's JSON API (DRF), for hosts that build their own screens: the same
operations as the pages, in the same scope, with the same capabilities, each view a thin
layer over actions.py.

- base.py: the policies every view sets (never the host's defaults), the portal's headers,
  one shape for refusals, the OpenAPI document's bearer scheme;
- serializers.py: what it reads and answers (never a secret but once, at its making);
- views.py (session, catalog), endpoints.py, messages.py, recovery.py: the views;
- urls.py: included by the portal's URLconf at ``api/``.
"""

"""The portal's pages: server-rendered Django templates (templates/webhook_receiver/
portal/), each a thin view over actions.py, wrapped by guard.portal_page."""

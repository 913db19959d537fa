"""`strata console`: every layer, Stack, update and pending approval in the browser, on loopback, as
the user's kubeconfig (models: pure page builders; store: watches; app: the ASGI app and server)."""

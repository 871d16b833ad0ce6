"""The API's routers, one module per concern; `app.create_app` includes them all."""

"""The OpenAI-compatible HTTP server: ``catengine serve`` (see ``catengine/cli/serve.py``) builds ``app.build_app``."""

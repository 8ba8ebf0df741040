"""The OpenAI-compatible HTTP server: ``catengine serve`` (see ``cli.py``) builds ``app.build_app``."""

"""The HTTP API: routes (app.py, steps.py, checks.py), the request guard and
rejections, models, views and the server."""

"""Who is asking: request signing (client.py), verification (server.py), settings and
identities (config.py), tokens and the replay cache (tokens.py), MUNGE (munge.py).
docs/security.md describes the modes."""

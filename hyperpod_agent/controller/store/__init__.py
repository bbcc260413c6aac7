"""The state store: the facade (facade.py), its tables (log, lease, steps, checks,
findings), the schema, SQL dialects and backends (SQLite, PostgreSQL)."""

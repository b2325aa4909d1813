"""Database layer: tables, engines and queries."""

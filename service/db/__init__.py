"""Persistence: the engine and transactions, the SQLAlchemy models, the migrations and the stores that read and write them."""

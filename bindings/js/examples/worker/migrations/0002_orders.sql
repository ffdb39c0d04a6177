-- The example's own data: the orders the idempotent endpoint creates.
CREATE TABLE IF NOT EXISTS orders (
  id TEXT PRIMARY KEY,
  principal TEXT NOT NULL,
  sku TEXT NOT NULL,
  qty INTEGER NOT NULL,
  created_at INTEGER NOT NULL
);

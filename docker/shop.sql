-- The demo's sample schema `shop` (scripts/demo loads it into the stack's
-- `source` database; docker-compose.yml into its own): customers,
-- products, orders and their items, with rows.
DROP SCHEMA IF EXISTS shop CASCADE;
CREATE SCHEMA shop;
CREATE TABLE shop.customers (
  id bigint PRIMARY KEY,
  email text NOT NULL,
  name varchar(80) NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  vip boolean NOT NULL DEFAULT false
);
CREATE TABLE shop.products (
  id integer PRIMARY KEY,
  sku uuid NOT NULL,
  title text NOT NULL,
  price numeric(10,2) NOT NULL,
  attributes jsonb
);
CREATE TABLE shop.orders (
  id bigint PRIMARY KEY,
  customer_id bigint NOT NULL REFERENCES shop.customers(id),
  status text NOT NULL,
  ordered_on date NOT NULL,
  total numeric(12,2) NOT NULL
);
CREATE TABLE shop.order_items (
  order_id bigint NOT NULL REFERENCES shop.orders(id) ON DELETE CASCADE,
  line smallint NOT NULL,
  product_id integer NOT NULL REFERENCES shop.products(id),
  quantity integer NOT NULL,
  PRIMARY KEY (order_id, line)
);
ALTER TABLE shop.customers REPLICA IDENTITY FULL;
ALTER TABLE shop.products REPLICA IDENTITY FULL;
ALTER TABLE shop.orders REPLICA IDENTITY FULL;
ALTER TABLE shop.order_items REPLICA IDENTITY FULL;
INSERT INTO shop.customers (id, email, name, vip)
  SELECT i, 'customer' || i || '@example.com', 'Customer ' || i, i % 10 = 0 FROM generate_series(1, 2000) i;
INSERT INTO shop.products
  SELECT i, md5(i::text)::uuid, 'Product ' || i, (i % 97) + 0.99, jsonb_build_object('color', (ARRAY['red','green','blue'])[1 + i % 3])
  FROM generate_series(1, 300) i;
INSERT INTO shop.orders
  SELECT i, 1 + i % 2000, (ARRAY['new','paid','shipped'])[1 + i % 3], date '2026-01-01' + (i % 300), 0
  FROM generate_series(1, 10000) i;
INSERT INTO shop.order_items
  SELECT o, l, 1 + (o * l) % 300, 1 + (o + l) % 4 FROM generate_series(1, 10000) o, generate_series(1, 3) l;
UPDATE shop.orders o SET total = s.total
  FROM (SELECT oi.order_id, sum(p.price * oi.quantity) AS total FROM shop.order_items oi JOIN shop.products p ON p.id = oi.product_id GROUP BY 1) s
  WHERE s.order_id = o.id;

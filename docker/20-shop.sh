#!/bin/sh
# Run once by the postgres image on an empty data directory, after
# 10-tributary.sql made the `source` database: the demo's sample schema.
set -e
psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d source -f /tributary/shop.sql

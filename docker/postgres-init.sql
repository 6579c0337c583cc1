-- Run once by the postgres image on an empty data directory, connected as
-- POSTGRES_USER (tributary: superuser, may replicate).
ALTER ROLE tributary WITH REPLICATION;
CREATE DATABASE source OWNER tributary;
CREATE DATABASE destination OWNER tributary;
-- The schema registry's store (APICURIO_STORAGE_KIND=sql): schemas and
-- their ids survive a restart of the registry.
CREATE DATABASE registry OWNER tributary;

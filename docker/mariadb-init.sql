-- Run once by the mariadb image on an empty data directory. MARIADB_USER
-- (tributary) only gets the MARIADB_DATABASE; CDC also needs to read the
-- binlog (docs/sources/mysql.md lists the grants).
GRANT ALL PRIVILEGES ON *.* TO 'tributary'@'%';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, RELOAD, SHOW DATABASES ON *.* TO 'tributary'@'%';
FLUSH PRIVILEGES;

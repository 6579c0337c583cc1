-- Run once by the mysql image on an empty data directory. MYSQL_USER
-- (tributary) only gets the MYSQL_DATABASE; CDC also needs to read the binlog.
GRANT ALL PRIVILEGES ON *.* TO 'tributary'@'%';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, RELOAD, SHOW DATABASES ON *.* TO 'tributary'@'%';
FLUSH PRIVILEGES;

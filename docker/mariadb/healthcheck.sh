#!/bin/bash
# Healthy when the server answers a query over its socket (InnoDB initialised).
exec mariadb -uroot --socket=/run/mysqld/mysqld.sock -e "SELECT 1 FROM information_schema.ENGINES WHERE ENGINE='InnoDB'" >/dev/null

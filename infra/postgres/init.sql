-- Runs once, when the postgres volume is empty (docker-entrypoint-initdb.d): one database per service, both
-- owned by POSTGRES_USER. To add them to an existing volume, run these two lines with psql.
CREATE DATABASE mlflow;
CREATE DATABASE prefect;

"""A real Debezium producer for the tests: the Debezium engine (pydbzengine) reads a database
through its Postgres connector (DBZ_CONNECTOR=postgres) or its MySQL connector
(DBZ_CONNECTOR=mysql, used against MariaDB) and hands over every record as Debezium emits it
(JSON with the schema wrapper, tombstones as a null value, keyless tables with a null key):
- with FEED_FILE set, each record is one line `{"key": <key JSON or null>, "value": <value
  JSON or null>}` appended to that file, flushed per batch;
- with SLUICE_PUSH_URL set, each batch is POSTed to that Sluice push endpoint as an array of
  such `{"key", "value"}` pairs.
Runs until killed. Settings come from the environment."""

import os
import time
import urllib.error
import urllib.request

from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

env = os.environ


def pair(record):
    key = "null" if record.key() is None else str(record.key())
    value = "null" if record.value() is None else str(record.value())
    return '{"key": ' + key + ', "value": ' + value + "}"


class Feed(BasePythonChangeHandler):
    def handleJsonBatch(self, records):
        pairs = [pair(r) for r in records]
        if env.get("FEED_FILE"):
            with open(env["FEED_FILE"], "a") as out:
                out.write("".join(p + "\n" for p in pairs))
        if env.get("SLUICE_PUSH_URL"):
            push(("[" + ",".join(pairs) + "]").encode())


def push(body):
    request = urllib.request.Request(
        env["SLUICE_PUSH_URL"],
        data=body,
        method="POST",
        headers={"Authorization": "Bearer " + env["SLUICE_PUSH_KEY"], "Content-Type": "application/json"},
    )
    while True:
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                if answer.status == 202:
                    return
        except urllib.error.HTTPError as e:
            if e.code != 503:
                raise
        time.sleep(0.1)


properties = {
    "name": "sluice-test",
    "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
    "offset.storage.file.filename": os.path.join(env["FEED_DIR"], "offsets.dat"),
    "offset.flush.interval.ms": "500",
    "database.hostname": "127.0.0.1",
    "database.port": env["DB_PORT"],
    "database.user": env["DB_USER"],
    "database.password": env["DB_PASSWORD"],
    "topic.prefix": "dbserver1",
    "snapshot.mode": "initial",
    "tombstones.on.delete": "true",
    # Truncates are skipped by default; the tests want them.
    "skipped.operations": "none",
    "key.converter.schemas.enable": "true",
    "value.converter.schemas.enable": "true",
    "poll.interval.ms": "100",
}

if env.get("DBZ_CONNECTOR", "postgres") == "postgres":
    properties.update({
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.dbname": env["DB_DATABASE"],
        "plugin.name": "pgoutput",
        "slot.name": "sluice_dbz",
        "publication.name": "sluice_dbz",
        "publication.autocreate.mode": "filtered",
        "table.include.list": env["DB_TABLES"],
    })
else:
    properties.update({
        "connector.class": "io.debezium.connector.mysql.MySqlConnector",
        "database.server.id": "5401",
        "database.include.list": env["DB_DATABASE"],
        "table.include.list": env["DB_TABLES"],
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": os.path.join(env["FEED_DIR"], "schema-history.dat"),
        "snapshot.locking.mode": "none",
        # DDL events go to a topic of their own in Kafka Connect; they are no row changes.
        "include.schema.changes": "false",
    })

DebeziumJsonEngine(properties=properties, handler=Feed()).run()

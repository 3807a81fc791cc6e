"""Django's SQLite backend, with connections kept for the next request of the same process.

Under ASGI every request runs in a thread of its own and Django's connections are per thread,
so each request opened the database afresh: SQLite read the schema again, prepared every
statement again, Django registered its functions again, 3 to 5 ms of CPU on an API list of 50
instances (bench/api.py). A connection closed outside any transaction and without errors goes
back to a short list of this process's instead, and the next connect takes it."""

import os
import threading

from django.db.backends.sqlite3 import base

KEEP = 8  # idle connections kept per process and database
_idle: dict[tuple[int, str], list] = {}
_lock = threading.Lock()


class DatabaseWrapper(base.DatabaseWrapper):
    def _key(self) -> tuple[int, str]:
        # per process: a connection must not cross a fork (Celery's pool processes)
        return os.getpid(), str(self.settings_dict["NAME"])

    def get_new_connection(self, conn_params):
        if not self.is_in_memory_db():
            with _lock:
                idle = _idle.get(self._key())
                if idle:
                    return idle.pop()
        return super().get_new_connection(conn_params)

    def _close(self):
        connection = self.connection
        if (
            connection is not None
            and not self.is_in_memory_db()
            and not self.errors_occurred
            and not connection.in_transaction
        ):
            with _lock:
                idle = _idle.setdefault(self._key(), [])
                if len(idle) < KEEP:
                    idle.append(connection)
                    return
        super()._close()

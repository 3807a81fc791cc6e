"""The audit log: who changed what, when and from where, written in the change's transaction.

Action functions call ``console.audit.recorder.record(...)``; the rows of the models listed
in ``console.audit.capture.CAPTURED`` are recorded by themselves whenever a person saves or
deletes one (the admin, the console, the API). The actor comes from the request
(``console.audit.middleware``), else it is the system."""

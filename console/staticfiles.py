"""The static files storage of a collected install (settings.STATIC_COLLECTED)."""

import os

from whitenoise.storage import CompressedManifestStaticFilesStorage


class CompressedManifestStorage(CompressedManifestStaticFilesStorage):
    """whitenoise's compressed manifest storage (each file also under a name with its content's
    hash, with .br and .gz copies), compressing only the hashed names, which are what pages link,
    and each of them once: a hashed name's content never changes, so the copies an earlier
    collectstatic made still hold. The first collection takes a minute (brotli at its best on
    the API docs' and Plotly's bundles), later ones, as `make run` does at every start, seconds."""

    def compress_files(self, paths):
        hashed = set(self.hashed_files.values())
        fresh = [
            path
            for path in paths
            if path in hashed
            and not any(os.path.exists(self.path(path) + ext) for ext in (".br", ".gz"))
        ]
        return super().compress_files(fresh)

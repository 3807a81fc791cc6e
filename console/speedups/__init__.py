"""What the console does faster than Django would by itself, fenced off here: each module leans
on Django's internals, which an upgrade may change, and imports nothing of the console, so
everything may use it. `prepared` runs the API's hottest queries compiled once
(settings.PREPARED_QUERIES turns it off); `cache` keeps Redis connection pools per process, not
per request."""

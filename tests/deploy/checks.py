"""What the deployment checks share: one line per check, and the failures collected."""

failures = []


def check(ok, what):
    """Prints `ok` or `FAIL` with what was checked; remembers a failure. Returns ok."""
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
    return ok

"""``python -m fedbug``: the ``fedbug`` command (:func:`fedbug.cli.main`)."""

from fedbug.cli import main

if __name__ == "__main__":  # imported (hasattr(fedbug, "__main__"), a doc tool), it runs nothing
    raise SystemExit(main())

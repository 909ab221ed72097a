"""``python -m fedbug``: the ``fedbug`` command (:func:`fedbug.cli.main`)."""

from fedbug.cli import main

raise SystemExit(main())

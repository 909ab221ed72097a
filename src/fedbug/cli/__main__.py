"""``python -m fedbug.cli``: the ``fedbug`` command."""

import sys

from fedbug.cli import main

if __name__ == "__main__":  # not in a --jobs worker, which spawn starts by importing this file
    sys.exit(main())

"""``fedbug sweep`` one run after another against ``--jobs N`` (README.md)."""

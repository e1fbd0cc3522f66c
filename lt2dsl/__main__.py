"""`python -m lt2dsl ...` runs the command line (see `lt2dsl.cli`)."""

from lt2dsl.cli import main

raise SystemExit(main())

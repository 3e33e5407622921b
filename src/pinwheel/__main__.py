from pinwheel.cli import main

raise SystemExit(main())

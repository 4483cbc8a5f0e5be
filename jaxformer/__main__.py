from jaxformer.cli import main

raise SystemExit(main())

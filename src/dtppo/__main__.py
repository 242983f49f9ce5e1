from dtppo.cli import main

main()

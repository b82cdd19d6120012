from tools.dashboard.cli import main

main()

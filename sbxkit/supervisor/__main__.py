from sbxkit.supervisor.service import main

main()

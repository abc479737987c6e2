from nsqpy.nsqadmin.app import main

main()

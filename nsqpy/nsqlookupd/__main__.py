from nsqpy.nsqlookupd.app import main

main()

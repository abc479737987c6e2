from nsqpy.nsqd.app import main

main()

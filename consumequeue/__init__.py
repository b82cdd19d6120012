# RocketMQ ConsumeQueue and IndexFile, built from committed commitlog positions.

module moat.test/go-client

go 1.24

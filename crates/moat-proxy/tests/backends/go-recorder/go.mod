module moat.test/go-recorder

go 1.24.0

require golang.org/x/net v0.46.0

require golang.org/x/text v0.30.0 // indirect

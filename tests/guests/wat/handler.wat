;; A handler component with the world's types, written by hand so a test can
;; make `handle` do what no toolchain would emit. The tests replace the
;; body of the core `handle` function (marked BODY), and may add fields to
;; the core module (marked MODULE), before loading it.
(component
  (core module $m
    (memory (export "memory") 1)
    ;; MODULE
    (global $next (mut i32) (i32.const 1024))
    ;; A bump allocator: enough for one delivery.
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p
        (i32.and
          (i32.add (global.get $next) (i32.sub (local.get 2) (i32.const 1)))
          (i32.sub (i32.const 0) (local.get 2))))
      (global.set $next (i32.add (local.get $p) (local.get 3)))
      (local.get $p))
    (func $handle (export "handle") (param i32) (result i32)
      ;; BODY
      (i32.const 16)))
  (core instance $i (instantiate $m))

  (type $value' (variant
    (case "string" string) (case "int" s64) (case "uint" u64) (case "float" f64)
    (case "boolean" bool) (case "bytes" (list u8)) (case "timestamp" s64)
    (case "null") (case "other" string)))
  (export $value "value" (type $value'))
  (type $property' (record (field "key" string) (field "value" $value)))
  (export $property "property" (type $property'))
  (type $delivery' (record
    (field "body" (list u8))
    (field "content-type" (option string))
    (field "subject" (option string))
    (field "message-id" (option string))
    (field "correlation-id" (option string))
    (field "reply-to" (option string))
    (field "properties" (list $property))
    (field "address" string)
    (field "tenant" string)
    (field "mount" string)
    (field "attempt" u32)
    (field "presettled" bool)))
  (export $delivery "delivery" (type $delivery'))
  (type $outcome' (variant (case "ack") (case "retry") (case "retry-after" u64) (case "drop")))
  (export $outcome "outcome" (type $outcome'))

  (func $handle (param "d" $delivery) (result $outcome)
    (canon lift (core func $i "handle") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (export "handle" (func $handle))
)

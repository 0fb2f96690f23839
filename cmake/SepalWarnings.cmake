# Warnings for every target; -Werror when SEPAL_WERROR (CI); ASan+UBSan when SEPAL_SANITIZE.
add_compile_options("$<$<COMPILE_LANGUAGE:C>:-Wall;-Wextra;-Wshadow;-Wstrict-prototypes;-Wmissing-prototypes;-Wno-unused-parameter>")
if(SEPAL_WERROR)
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:-Werror>")
endif()
add_compile_definitions(_GNU_SOURCE)
if(SEPAL_SANITIZE)
  # a target with the property SEPAL_NO_SANITIZE (the C++ DHT helper, which links OpenDHT unsanitized) compiles
  # its C files without them too
  add_compile_options("$<$<AND:$<COMPILE_LANGUAGE:C>,$<NOT:$<BOOL:$<TARGET_PROPERTY:SEPAL_NO_SANITIZE>>>>:-fsanitize=address,undefined;-fno-omit-frame-pointer;-fno-sanitize-recover=undefined>")
  add_link_options("$<$<LINK_LANGUAGE:C>:-fsanitize=address,undefined>") # not the C++ DHT helper (OpenDHT)
endif()
